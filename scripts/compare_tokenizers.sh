# Equal-time tokenizer comparison on Tatoeba (issue 12): each variant trains for the same BUDGET
# seconds of training (data preparation not counted: the clock starts at the run's "model:" log
# line), then is stopped with SIGTERM (it checkpoints) and evaluated, alone, greedy and beam 4, on
# its test split and its unseen-words sets. All variants share one split (the data section is the
# same), so their test and unseen-words sets are identical.
#
#   BUDGET=3600 OUT=cmp bash scripts/compare_tokenizers.sh            # one after the other, ~4 x 1 h
#   ONLY="word bpe" BUDGET=900 bash scripts/compare_tokenizers.sh     # a subset, shorter
#   PARALLEL=1 BUDGET=4800 bash scripts/compare_tokenizers.sh         # all at once, one thread each
#
# One after the other, each variant has the machine to itself, but a load that changes between
# the runs favours one of them. PARALLEL=1 trains all variants at the same time with one torch
# thread each, so that they share the cores and whatever else runs under exactly the same
# conditions (each gets cores / variants of the machine). Nothing else should run meanwhile
# (say what did, if anything). Results: $OUT/<variant>/eval/*.json; a table is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

BUDGET=${BUDGET:-3600}
OUT=${OUT:-cmp}
TMT=${TMT:-.venv/bin/tmt}
ONLY=${ONLY:-"word word_uncapped bpe unigram"}
PARALLEL=${PARALLEL:-0}
COMMON=(--set train.keep_last=10 --set train.checkpoint_every=250)
[[ "$PARALLEL" == 1 ]] && COMMON+=(--set train.threads=1)

declare -A ARGS=(
  [word]="--config configs/tatoeba_en_it_word.yaml"                               # 12.3k / 16k words
  [word_uncapped]="--config configs/tatoeba_en_it_word.yaml --set tokenizer.max_vocab=null"  # every word seen twice
  [bpe]="--config configs/tatoeba_en_it_d256.yaml"                                # 8k joint BPE
  [unigram]="--config configs/tatoeba_en_it_unigram.yaml"                         # 8k joint unigram
)

# Train one variant for BUDGET seconds from its first "model:" log line, then stop it (SIGTERM:
# it writes its checkpoint and exits).
train_for_budget() {
  local variant=$1 run="$OUT/$1" pid
  # shellcheck disable=SC2086
  $TMT train ${ARGS[$variant]} "${COMMON[@]}" --run-dir "$run" &
  pid=$!
  until grep -q "model: " "$run/train.log" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "$variant: training ended before it started"; return 1; }
    sleep 5
  done
  echo "$variant: training for $BUDGET s from $(date -u +%H:%M:%S)"
  sleep "$BUDGET"
  kill -TERM "$pid"
  wait "$pid" || true
  echo "$variant: stopped at $(date -u +%H:%M:%S)"
}

trained=()
for variant in $ONLY; do
  if [[ -e "$OUT/$variant/checkpoints/last.pt" ]]; then
    echo "$OUT/$variant exists: skipped (remove it to train again)"; continue
  fi
  trained+=("$variant")
  if [[ "$PARALLEL" == 1 ]]; then
    train_for_budget "$variant" &
  else
    train_for_budget "$variant"
  fi
done
wait

# Evaluation runs after all training, one variant at a time, of each variant's last.pt: the model
# as the budget left it (best.pt can be up to train.valid_every steps older, a different amount
# for each variant).
for variant in "${trained[@]}"; do
  for beam in 1 4; do
    $TMT evaluate --run "$OUT/$variant" --checkpoint last --beam "$beam" --unseen >/dev/null
  done
done

python3 - "$OUT" $ONLY <<'EOF'
import json, pathlib, sys
out, variants = pathlib.Path(sys.argv[1]), sys.argv[2:]
print("variant | beam | test BLEU / chrF | rare_words BLEU | names BLEU | outputs with [UNK]")
for variant in variants:
    for beam in (1, 4):
        path = out / variant / "eval" / f"test.last.beam{beam}.json"
        if not path.is_file():
            continue
        r = json.loads(path.read_text())
        u = r.get("unseen", {})
        print(f"{variant} | {beam} | {r['bleu']:.2f} / {r['chrf']:.2f} | "
              f"{u.get('rare_words', {}).get('bleu', float('nan')):.2f} | "
              f"{u.get('names', {}).get('bleu', float('nan')):.2f} | {r['outputs_with_unk']:.3f}")
EOF
