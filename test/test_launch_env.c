/* test_launch_env.c: tprun's readings of the scheduler and the machine
 * (tp/launch_env.h): SLURM hostlists expanded as SLURM expands them (ranges,
 * lists, zero padding, several brackets) and refused with a reason when
 * malformed; the GPU count under CUDA_VISIBLE_DEVICES as CUDA counts it. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tprun/launch_env.h"

/* list expands to exactly the hosts in want (space-separated). */
static void expands(const char *list, const char *want) {
    char **hosts = NULL, err[400] = "";
    const int n = nodelist_expand(list, &hosts, err, sizeof err);
    char got[2048] = "";
    for (int i = 0; i < n; i++) {
        if (i) strcat(got, " ");
        if (strlen(got) + strlen(hosts[i]) < sizeof got - 2) strcat(got, hosts[i]);
    }
    CHECK(n > 0 && strcmp(got, want) == 0, "'%s': want '%s', got %d hosts '%s' (%s)", list, want, n, got, err);
    nodelist_free(hosts, n > 0 ? n : 0);
}

/* list is refused with a message containing why. */
static void refused(const char *list, const char *why) {
    char **hosts = NULL, err[400] = "";
    const int n = nodelist_expand(list, &hosts, err, sizeof err);
    CHECK(n == -1 && hosts == NULL && strstr(err, why) != NULL, "'%s': want a refusal with '%s', got %d (%s)",
          list ? list : "(null)", why, n, err);
    if (n > 0) nodelist_free(hosts, n);
}

int main(void) {
    expands("node7", "node7");
    expands("gpu[01-04]", "gpu01 gpu02 gpu03 gpu04");
    expands("a[1,3-5],b7", "a1 a3 a4 a5 b7");
    expands("gpu[08-11]", "gpu08 gpu09 gpu10 gpu11");
    expands("n[001-002,010]", "n001 n002 n010");
    expands("r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2");
    expands("rack1-[3-4].ib", "rack1-3.ib rack1-4.ib");
    expands("127.0.0.[1-2]", "127.0.0.1 127.0.0.2");
    expands("x[9-10],y", "x9 x10 y");
    refused("", "empty");
    refused(NULL, "empty");
    refused("gpu[01-04", "'[' without ']'");
    refused("gpu01]", "']' without '['");
    refused("gpu[[1-2]]", "inside a bracket");
    refused("gpu[4-1]", "runs backwards");
    refused("gpu[a-b]", "is not a number");
    refused("gpu[]", "is not a number");
    refused("gpu[1,,2]", "is not a number");
    refused("a,,b", "empty host name");
    refused("a,", "empty host name");
    refused("bad host", "cannot appear in a host name");
    refused("n[1-99999999]", "more than");
    // The GPUs CUDA would show: CUDA_VISIBLE_DEVICES's entries up to the first unusable one.
    CHECK(visible_gpu_count(NULL, 4) == 4, "unset: every GPU nvidia-smi lists");
    CHECK(visible_gpu_count("", 4) == 0, "empty: none");
    CHECK(visible_gpu_count("0,1", 4) == 2, "two indices");
    CHECK(visible_gpu_count("3", 4) == 1, "one index");
    CHECK(visible_gpu_count("0,7,1", 4) == 1, "an index beyond the GPUs ends the list");
    CHECK(visible_gpu_count("1,x", 4) == 1, "junk ends the list");
    CHECK(visible_gpu_count("-1", 4) == 0, "-1 hides every GPU");
    CHECK(visible_gpu_count("GPU-8f2c1d00-aaaa,MIG-12", 1) == 2, "UUIDs");
    CHECK(visible_gpu_count("0", 0) == 0, "no GPU at all");
    return check_report("test_launch_env");
}
