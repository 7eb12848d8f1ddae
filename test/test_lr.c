/* test_lr.c: the learning-rate schedules of optim.h against their closed
 * forms evaluated here in double precision (an independent oracle: the
 * formulas as the paper and the documentation state them), plus the
 * shape facts a run relies on: the warmup ramp, the peak at the end of the
 * warmup, cosine reaching 0 exactly at the run's last step and staying
 * there, the time horizon of --max-minutes (whichever of steps and time
 * ends first), and the flag names round-tripping. */
#include <math.h>
#include <string.h>
#include "check.h"
#include "transformer/optim.h"

/* lr_at computes in double and rounds once to float. */
#define LR_RTOL 1e-6

static double inv_sqrt_ref(double peak, int w, int s) {
    if (w <= 0) return peak;
    return s < w ? peak * s / w : peak * sqrt((double)w / s);
}

static double cosine_ref(double peak, int w, int total, int s) {
    if (s < w) return peak * s / w;
    if (total <= w) return peak;
    if (s >= total) return 0.0;
    return peak * 0.5 * (1.0 + cos(acos(-1.0) * (s - w) / (double)(total - w)));
}

int main(void) {
    OptimConfig c = optim_defaults();
    c.lr = 2e-3f;
    c.warmup = 200;
    CHECK(c.schedule == LR_INV_SQRT, "the default schedule is inv-sqrt");
    for (int s = 1; s <= 5000; s += 7)
        CHECK_CLOSE(lr_at(&c, s), inv_sqrt_ref(c.lr, c.warmup, s), LR_RTOL, 0.0, "inv-sqrt");
    CHECK_CLOSE(lr_at(&c, 200), c.lr, LR_RTOL, 0.0, "inv-sqrt peak at the end of the warmup");
    CHECK_CLOSE(lr_at(&c, 800), c.lr * 0.5, LR_RTOL, 0.0, "inv-sqrt halves at 4x the warmup");

    c.schedule = LR_COSINE;
    c.decay_steps = 1500;
    for (int s = 1; s <= 1700; s += 3)
        CHECK_CLOSE(lr_at(&c, s), cosine_ref(c.lr, c.warmup, c.decay_steps, s), LR_RTOL, 1e-12, "cosine");
    CHECK_CLOSE(lr_at(&c, 100), c.lr * 0.5, LR_RTOL, 0.0, "cosine warmup is linear");
    CHECK_CLOSE(lr_at(&c, 200), c.lr, LR_RTOL, 0.0, "cosine peak at the end of the warmup");
    CHECK_CLOSE(lr_at(&c, 850), c.lr * 0.5, LR_RTOL, 0.0, "cosine halves midway through the decay");
    CHECK(lr_at(&c, 1500) == 0.0f && lr_at(&c, 9999) == 0.0f, "cosine is 0 from the last step on");
    for (int s = 201; s < 1500; s++)
        CHECK(lr_at(&c, s) <= lr_at(&c, s - 1) && lr_at(&c, s) > 0.0f, "cosine decays monotonically (step %d)", s);

    c.warmup = 0;  // no warmup: the cosine starts at the peak
    CHECK_CLOSE(lr_at(&c, 1), cosine_ref(c.lr, 0, c.decay_steps, 1), LR_RTOL, 0.0, "cosine without warmup");
    c.warmup = 300;
    c.decay_steps = 100;  // a run shorter than its warmup never leaves the ramp
    CHECK_CLOSE(lr_at(&c, 50), c.lr / 6.0, LR_RTOL, 0.0, "cosine in a run shorter than its warmup");

    /* The time horizon (--max-minutes): the cosine follows whichever of the
     * step and time fractions is further on; the warmup and inv-sqrt ignore it. */
    c.warmup = 200;
    c.decay_steps = 1500;
    CHECK(lr_at_frac(&c, 850, -1.0) == lr_at(&c, 850), "no horizon: lr_at");
    CHECK(lr_at_frac(&c, 850, 0.1) == lr_at(&c, 850), "steps further on than the time: the steps' cosine");
    CHECK_CLOSE(lr_at_frac(&c, 300, 0.5), c.lr * 0.5, LR_RTOL, 0.0, "time further on: half the peak midway");
    CHECK_CLOSE(lr_at_frac(&c, 300, 0.25), cosine_ref(c.lr, 0, 4, 1), LR_RTOL, 0.0, "the time's cosine");
    CHECK(lr_at_frac(&c, 300, 1.0) == 0.0f && lr_at_frac(&c, 300, 7.0) == 0.0f, "0 once the time is spent");
    CHECK(lr_at_frac(&c, 100, 0.9) == lr_at(&c, 100), "the warmup stays in steps");
    c.decay_steps = 100;  // a step count inside the warmup: the time alone decays after it
    CHECK_CLOSE(lr_at_frac(&c, 250, 0.5), c.lr * 0.5, LR_RTOL, 0.0, "time horizon after a short step count");
    c.schedule = LR_INV_SQRT;
    CHECK(lr_at_frac(&c, 800, 0.99) == lr_at(&c, 800), "inv-sqrt has no horizon");

    LrSchedule s;
    CHECK(lr_schedule_parse("cosine", &s) == 0 && s == LR_COSINE, "parse cosine");
    CHECK(lr_schedule_parse("inv-sqrt", &s) == 0 && s == LR_INV_SQRT, "parse inv-sqrt");
    CHECK(lr_schedule_parse("linear", &s) == -1 && lr_schedule_parse("", &s) == -1, "unknown names refused");
    CHECK(strcmp(lr_schedule_name(LR_COSINE), "cosine") == 0 && strcmp(lr_schedule_name(LR_INV_SQRT), "inv-sqrt") == 0,
          "names");
    return check_report("test_lr");
}
