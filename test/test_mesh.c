/* test_mesh.c: world -> (tp, dp, pp) coordinates and group lists.
 *
 * The expected layouts are written out by hand for small meshes (Megatron's
 * order: tp fastest, then dp, then pp) rather than recomputed with the
 * formula under test; every refused layout is checked for its sentence. */
#include "check.h"
#include "tp/mesh.h"

#include <string.h>

static int same(const int *a, const int *b, int n) { return memcmp(a, b, (size_t)n * sizeof(int)) == 0; }

static void test_tp2_dp2_pp1(void) {
    // rank: (tp_rank, dp_rank)
    const int coords[4][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}};
    const int tp_groups[4][2] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
    const int dp_groups[4][2] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
    char err[256];
    for (int r = 0; r < 4; r++) {
        Mesh m;
        CHECK(mesh_init(&m, 4, r, 2, 2, 1, err, sizeof err) == 0, "rank %d: %s", r, err);
        CHECK(m.tp_rank == coords[r][0] && m.dp_rank == coords[r][1] && m.pp_rank == 0, "rank %d coords %d %d %d",
              r, m.tp_rank, m.dp_rank, m.pp_rank);
        CHECK(m.world == 4 && m.rank == r && m.tp == 2 && m.dp == 2 && m.pp == 1, "rank %d sizes", r);
        int g[2], p[1];
        mesh_tp_group(&m, g);
        CHECK(same(g, tp_groups[r], 2), "rank %d tp group %d %d", r, g[0], g[1]);
        mesh_dp_group(&m, g);
        CHECK(same(g, dp_groups[r], 2), "rank %d dp group %d %d", r, g[0], g[1]);
        mesh_pp_group(&m, p);
        CHECK(p[0] == r, "rank %d pp group %d", r, p[0]);
        CHECK(mesh_rank_of(&m, m.tp_rank, m.dp_rank, m.pp_rank) == r, "rank %d round trip", r);
    }
}

static void test_tp2_dp2_pp2(void) {
    // rank: (tp_rank, dp_rank, pp_rank)
    const int coords[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0},
                              {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
    const int tp_groups[8][2] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}, {4, 5}, {4, 5}, {6, 7}, {6, 7}};
    const int dp_groups[8][2] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {4, 6}, {5, 7}};
    const int pp_groups[8][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}};
    char err[256];
    for (int r = 0; r < 8; r++) {
        Mesh m;
        CHECK(mesh_init(&m, 8, r, 2, 2, 2, err, sizeof err) == 0, "rank %d: %s", r, err);
        CHECK(m.tp_rank == coords[r][0] && m.dp_rank == coords[r][1] && m.pp_rank == coords[r][2],
              "rank %d coords %d %d %d", r, m.tp_rank, m.dp_rank, m.pp_rank);
        int g[2];
        mesh_tp_group(&m, g);
        CHECK(same(g, tp_groups[r], 2), "rank %d tp group %d %d", r, g[0], g[1]);
        mesh_dp_group(&m, g);
        CHECK(same(g, dp_groups[r], 2), "rank %d dp group %d %d", r, g[0], g[1]);
        mesh_pp_group(&m, g);
        CHECK(same(g, pp_groups[r], 2), "rank %d pp group %d %d", r, g[0], g[1]);
    }
    Mesh m;
    CHECK(mesh_init(&m, 8, 0, 2, 2, 2, err, sizeof err) == 0, "%s", err);
    for (int t = 0; t < 2; t++)
        for (int d = 0; d < 2; d++)
            for (int p = 0; p < 2; p++)
                CHECK(mesh_rank_of(&m, t, d, p) == t + 2 * (d + 2 * p), "rank_of(%d, %d, %d)", t, d, p);
}

/* Larger uneven mesh: every rank's groups contain it at its own coordinate. */
static void test_tp3_dp2_pp2(void) {
    char err[256];
    for (int r = 0; r < 12; r++) {
        Mesh m;
        CHECK(mesh_init(&m, 12, r, 3, 2, 2, err, sizeof err) == 0, "rank %d: %s", r, err);
        CHECK(m.tp_rank == r % 3 && m.dp_rank == (r / 3) % 2 && m.pp_rank == r / 6, "rank %d coords", r);
        int tpg[3], dpg[2], ppg[2];
        mesh_tp_group(&m, tpg);
        mesh_dp_group(&m, dpg);
        mesh_pp_group(&m, ppg);
        CHECK(tpg[m.tp_rank] == r && dpg[m.dp_rank] == r && ppg[m.pp_rank] == r, "rank %d in its groups", r);
        CHECK(tpg[0] == r - r % 3 && tpg[2] == tpg[0] + 2, "rank %d tp group contiguous", r);
        CHECK(dpg[1] - dpg[0] == 3 && ppg[1] - ppg[0] == 6, "rank %d strides", r);
    }
}

static void expect_refused(int world, int rank, int tp, int dp, int pp, const char *sentence) {
    Mesh m;
    char err[256] = "";
    int rc = mesh_init(&m, world, rank, tp, dp, pp, err, sizeof err);
    CHECK(rc == -1, "world %d rank %d tp %d dp %d pp %d accepted", world, rank, tp, dp, pp);
    CHECK(strcmp(err, sentence) == 0, "got \"%s\" want \"%s\"", err, sentence);
}

static void expect_model_refused(int tp, int n_heads, int d_ff, int vocab, const char *sentence) {
    Mesh m;
    char err[256] = "";
    CHECK(mesh_init(&m, tp, 0, tp, 1, 1, err, sizeof err) == 0, "%s", err);
    int rc = mesh_check_model(&m, n_heads, d_ff, vocab, err, sizeof err);
    CHECK(rc == -1, "tp %d heads %d d_ff %d vocab %d accepted", tp, n_heads, d_ff, vocab);
    CHECK(strcmp(err, sentence) == 0, "got \"%s\" want \"%s\"", err, sentence);
}

static void test_refused(void) {
    expect_refused(4, 0, 2, 3, 1, "tp (2) x dp (3) x pp (1) = 6 does not match the world size 4");
    expect_refused(8, 0, 2, 2, 1, "tp (2) x dp (2) x pp (1) = 4 does not match the world size 8");
    expect_refused(4, 0, 0, 4, 1, "tp (0) must be at least 1");
    expect_refused(4, 0, 4, -1, 1, "dp (-1) must be at least 1");
    expect_refused(4, 0, 4, 1, 0, "pp (0) must be at least 1");
    expect_refused(0, 0, 1, 1, 1, "the world size (0) must be at least 1");
    expect_refused(4, 4, 2, 2, 1, "rank 4 is outside the world of size 4");
    expect_refused(4, -1, 2, 2, 1, "rank -1 is outside the world of size 4");
    // A product that overflows int is still refused, not wrapped around.
    expect_refused(1, 0, 65536, 65536, 1,
                   "tp (65536) x dp (65536) x pp (1) = 4294967296 does not match the world size 1");

    expect_model_refused(4, 6, 1024, 32000, "n_heads (6) is not divisible by tp (4)");
    expect_model_refused(4, 8, 1026, 32000, "d_ff (1026) is not divisible by tp (4)");
    expect_model_refused(4, 8, 1024, 32002, "the padded vocabulary (32002) is not divisible by tp (4)");
    expect_model_refused(2, 0, 1024, 32000,
                         "n_heads (0), d_ff (1024) and the padded vocabulary (32000) must be positive");

    Mesh m;
    char err[256] = "";
    CHECK(mesh_init(&m, 4, 1, 4, 1, 1, err, sizeof err) == 0, "%s", err);
    CHECK(mesh_check_model(&m, 8, 1024, 32000, err, sizeof err) == 0, "valid model refused: %s", err);
    CHECK(mesh_init(&m, 1, 0, 1, 1, 1, err, sizeof err) == 0, "%s", err);
    CHECK(mesh_check_model(&m, 7, 999, 31999, err, sizeof err) == 0, "tp 1 refused: %s", err);
}

int main(void) {
    test_tp2_dp2_pp1();
    test_tp2_dp2_pp2();
    test_tp3_dp2_pp2();
    test_refused();
    return check_report("test_mesh");
}
