#!/usr/bin/env bash
# Training recipes compared side by side on one machine, then the winner
# trained alone: the way to choose the main job's recipe with few GPU minutes.
#
#   bash scripts/sweep_recipe.sh CORPUS_DIR [OUT_DIR]       # default OUT_DIR sweep/
#
# 1. Every candidate (SWEEP_CANDIDATES: a file of lines "NAME FLAGS...", '#'
#    comments; default the list below: few, so each gets a fair share of the
#    machine) is a separate train_mt process with the same seed, data and
#    SWEEP_FLAGS, all started at once (one GPU holds them all: at 4k tokens a
#    run uses a small share of it), each ended by --max-minutes
#    SWEEP_MINUTES (7: the horizon of the winner's run, not a few thousand
#    steps, since the better-regularised recipes peak later; SWEEP_STEPS
#    caps the steps as well); dev BLEU every SWEEP_EVAL steps.
#    The tokenizers the candidates need are prepared first, one at a time,
#    so that no two runs build the same cache.
# 2. The table (OUT_DIR/sweep.md, one JSON line per candidate in
#    sweep.jsonl): each candidate's best dev BLEU wherever it reached it
#    (step and minute), its last, the steps it reached, tokens/s; ranked by
#    the best dev BLEU (or, with SWEEP_METRIC=loss, the lowest dev loss).
# 3. Unless SWEEP_WINNER_MINUTES is 0: the winner alone, ended by
#    --max-minutes SWEEP_WINNER_MINUTES, keeping the best checkpoint and
#    averaging the newest SWEEP_AVERAGE; scripts/score_run.sh then picks the
#    checkpoint (best or averaged) and the length penalty (SWEEP_LENPENS) on
#    dev and scores the test set; with SWEEP_JAEN=1 the same recipe trained
#    and scored ja->en.
# SWEEP_WINNER=NAME skips 1 and 2: the named candidate is the winner. Where
# one command may not run past a limit (a borrowed GPU's 10 minutes), the
# comparison runs with SWEEP_WINNER_MINUTES=0 and the winner in a second
# command with SWEEP_WINNER set to the name the first one printed.
# The last lines name the winner, its flags and test BLEU.
#
# Environment: SWEEP_BIN (folder of train_mt and translate_mt; default
# build-gpu, else build), SWEEP_DEVICE (auto), SWEEP_PRESET (base),
# SWEEP_FLAGS (more train_mt flags for every run; default
# "--batch-tokens 4096 --length-bucket 8"), SWEEP_MINUTES (7), SWEEP_STEPS
# (unset), SWEEP_EVAL (500), SWEEP_BEAM (beam for the test set, 5),
# SWEEP_LENPENS ("0.6 1.0 1.4"), SWEEP_AVERAGE (3), SWEEP_WINNER_MINUTES
# (10), SWEEP_JAEN (0), SWEEP_CANDIDATES, SWEEP_METRIC (bleu; loss ranks by
# dev loss, for runs too short for BLEU).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
corpus=${1:-}
out=${2:-sweep}
[ -n "$corpus" ] && [ -s "$corpus/train.en" ] || { echo "sweep_recipe: usage: sweep_recipe.sh CORPUS_DIR [OUT_DIR]" >&2; exit 2; }
corpus=$(cd "$corpus" && pwd)
bin=${SWEEP_BIN:-}
if [ -z "$bin" ]; then
  for d in "$root/build-gpu" "$root/build"; do [ -x "$d/train_mt" ] && { bin=$d; break; }; done
fi
[ -x "${bin:-}/train_mt" ] && [ -x "$bin/translate_mt" ] || { echo "sweep_recipe: no train_mt (set SWEEP_BIN)" >&2; exit 2; }
eval_every=${SWEEP_EVAL:-500} minutes=${SWEEP_WINNER_MINUTES:-10}
beam=${SWEEP_BEAM:-5} average=${SWEEP_AVERAGE:-3}
bound=(--max-steps "${SWEEP_STEPS:-1000000}" --max-minutes "${SWEEP_MINUTES:-7}")
bound_text="${SWEEP_MINUTES:-7} minutes${SWEEP_STEPS:+ (at most $SWEEP_STEPS steps)}"
read -r -a common <<< "${SWEEP_FLAGS:---batch-tokens 4096 --length-bucket 8}"
common=(--data "$corpus" --device "${SWEEP_DEVICE:-auto}" --preset "${SWEEP_PRESET:-base}" --seed 1
        --log-interval 100 "${common[@]}")
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
cache=$out/cache

# The candidates: the levers of a model that overfits 50k pairs (docs/quality.md), few enough that each
# gets a fair share of one GPU: the base preset's recipe (dropout 0.3), fairseq's recipe for IWSLT's 160k
# pairs (a 1024-wide FFN and 4 heads), subword sampling (Kudo 2018; alpha 0.2: at 0.1 the samples are 43%
# longer than the best segmentation, docs/data.md), and dropout on the attention probabilities and the FFN
# activations as well (fairseq's --attention-dropout, --activation-dropout).
default_candidates() {
  cat <<'EOF'
# name          flags (after the common ones)
drop3           --dropout 0.3
iwslt           --dropout 0.3 --ffn-hidden-size 1024 --heads 4
drop3-spm       --dropout 0.3 --spm-alpha 0.2
drop3-adrop     --dropout 0.3 --attention-dropout 0.1 --activation-dropout 0.1
EOF
}
names=() flagsets=()
while read -r name rest; do
  [[ -z $name || $name == \#* ]] && continue
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "sweep_recipe: candidate name '$name': letters, digits, . _ - only" >&2; exit 2; }
  names+=("$name") flagsets+=("$rest")
done < <(if [ -n "${SWEEP_CANDIDATES:-}" ]; then cat "$SWEEP_CANDIDATES"; else default_candidates; fi)
[ "${#names[@]}" -gt 0 ] || { echo "sweep_recipe: no candidates" >&2; exit 2; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3
failed=0
# 1 and 2: the candidates side by side, then the table; sets winner.
compare_candidates() {
  echo "sweep_recipe: ${#names[@]} candidates side by side, $bound_text each, dev BLEU every $eval_every; train_mt from $bin"

  # 1. the tokenizers, one at a time (a candidate's --spm-vocab-size), then every candidate at once
  declare -A prepared=()
  for i in "${!names[@]}"; do
    read -r -a f <<< "${flagsets[$i]}"
    v=default
    for ((k = 0; k < ${#f[@]}; k++)); do [ "${f[$k]}" = --spm-vocab-size ] && v=${f[$((k + 1))]:-default}; done
    [ -n "${prepared[$v]:-}" ] && continue
    prepared[$v]=1
    "$bin/train_mt" "${common[@]}" "${f[@]}" --cache-dir "$cache" --max-steps 1 --eval-interval 0 \
      > "$out/prepare-$v.log" 2>&1 || { tail -n 5 "$out/prepare-$v.log"; echo "sweep_recipe: preparing the data failed" >&2; exit 1; }
  done
  pids=()
  for i in "${!names[@]}"; do
    read -r -a f <<< "${flagsets[$i]}"
    "$bin/train_mt" "${common[@]}" "${f[@]}" --cache-dir "$cache" "${bound[@]}" --eval-interval "$eval_every" \
      --metrics "$out/${names[$i]}.jsonl" > "$out/${names[$i]}.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!names[@]}"; do
    wait "${pids[$i]}" || { failed=1; echo "sweep_recipe: ${names[$i]} failed: $(tail -n 1 "$out/${names[$i]}.log")" >&2; }
  done

  # 2. the table
  printf '%s\n' "${names[@]}" > "$out/names.txt"
  printf '%s\n' "${flagsets[@]}" > "$out/flags.txt"
  winner=$("$py" - "$out" "${SWEEP_METRIC:-bleu}" <<'PY'
import json, os, sys
out, metric = sys.argv[1], sys.argv[2]
key, better = ("dev_bleu", max) if metric == "bleu" else ("dev_loss", min)
label = "dev BLEU" if metric == "bleu" else "dev loss"
names = open(os.path.join(out, "names.txt")).read().split("\n")[:-1]
flags = open(os.path.join(out, "flags.txt")).read().split("\n")[:-1]
runs = []
for name, fl in zip(names, flags):
    recs = []
    path = os.path.join(out, name + ".jsonl")
    if os.path.exists(path):
        recs = [json.loads(l) for l in open(path) if l.strip()]
    evals = [r for r in recs if key in r and "averaged" not in r]
    dev = {r["step"]: r[key] for r in evals}
    minute = {r["step"]: r.get("elapsed_s", float("nan")) / 60 for r in evals}
    tps = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r and r.get("step", 0) > 1]
    steps = max((r["step"] for r in recs if "step" in r and "averaged" not in r), default=0)
    r = dict(name=name, flags=fl, dev=dev, steps=steps, tokens_per_s=sum(tps) / len(tps) if tps else None)
    # the best wherever the run reached it (the runs end by time, at different steps), the first among equals
    r["best_step"], r["best"] = better(sorted(dev.items()), key=lambda kv: kv[1]) if dev else (None, None)
    r["best_minute"] = minute.get(r["best_step"])
    r["last"] = dev[max(dev)] if dev else None
    runs.append(r)
ranked = sorted([r for r in runs if r["best"] is not None], key=lambda r: -r["best"] if better is max else r["best"])
with open(os.path.join(out, "sweep.jsonl"), "w") as f:
    for r in runs:
        f.write(json.dumps({k: r[k] for k in ("name", "flags", "best", "best_step", "best_minute", "last", "steps",
                                              "tokens_per_s")} | {"metric": key, key: r["dev"]}) + "\n")
lines = [f"| rank | candidate | flags | best {label} (step, minute) | last | steps reached | tokens/s (shared) |",
         "|---|---|---|---|---|---|---|"]
for k, r in enumerate(ranked, 1):
    tps = f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-"
    lines.append(f"| {k} | {r['name']} | `{r['flags']}` | {r['best']:.2f} ({r['best_step']}, {r['best_minute']:.1f}) | "
                 f"{r['last']:.2f} | {r['steps']} | {tps} |")
for r in runs:
    if r["best"] is None:
        lines.append(f"| - | {r['name']} | `{r['flags']}` | no evaluation (failed?) | - | {r['steps']} | - |")
open(os.path.join(out, "sweep.md"), "w").write("\n".join(lines) + "\n")
print(ranked[0]["name"] if ranked else "")
PY
  )
  cat "$out/sweep.md"
  [ -n "$winner" ] || { echo "sweep_recipe: no candidate was evaluated" >&2; exit 1; }
}

winner=${SWEEP_WINNER:-}
if [ -n "$winner" ]; then
  printf '%s\n' "${names[@]}" | grep -qxF -- "$winner" ||
    { echo "sweep_recipe: SWEEP_WINNER=$winner is not a candidate (${names[*]})" >&2; exit 2; }
  [ "$minutes" != 0 ] || { echo "sweep_recipe: SWEEP_WINNER with SWEEP_WINNER_MINUTES=0 runs nothing" >&2; exit 2; }
  echo "sweep_recipe: no comparison (SWEEP_WINNER): $winner alone"
else
  compare_candidates
fi
wflags=""
for i in "${!names[@]}"; do [ "${names[$i]}" = "$winner" ] && wflags=${flagsets[$i]}; done
echo "sweep_recipe: winner $winner: $wflags"
[ "$minutes" != 0 ] || exit "$failed"

# 3. the winner alone, en->ja (and ja->en with SWEEP_JAEN=1)
read -r -a f <<< "$wflags"
dirs=(en-ja)
[ "${SWEEP_JAEN:-0}" = 1 ] && dirs+=(ja-en)
for dir in "${dirs[@]}"; do
  src=${dir%-*} tgt=${dir#*-}
  w=$out/winner-$dir
  rm -rf "$w"
  "$bin/train_mt" "${common[@]}" "${f[@]}" --cache-dir "$cache" --direction "$dir" --max-steps 1000000 \
    --max-minutes "$minutes" --eval-interval "$eval_every" --save "$w" --save-interval "$eval_every" \
    --keep-last "$average" --keep-best bleu --average-last "$average" --metrics "$w.jsonl" > "$w.log" 2>&1 ||
    { tail -n 5 "$w.log"; echo "sweep_recipe: the winner's $dir run failed" >&2; exit 1; }
  SCORE_BIN=$bin SCORE_BEAM=$beam SCORE_LENPENS=${SWEEP_LENPENS:-0.6 1.0 1.4} SCORE_DEVICE=${SWEEP_DEVICE:-auto} \
    bash "$root/scripts/score_run.sh" "$w" "$w.jsonl" "$corpus" "$src" "$tgt" "$w" > "$w.score.log" 2>&1 ||
    { cat "$w.score.log"; echo "sweep_recipe: scoring the winner's $dir model failed" >&2; exit 1; }
  sed 's/^score_run: /sweep_recipe: '"$dir"': /' "$w.score.log"
  echo "sweep_recipe: $dir: $winner for $minutes min: $(tail -n 1 "$w.score.log" | sed 's/^score_run: //')"
done
exit "$failed"
