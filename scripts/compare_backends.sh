#!/usr/bin/env bash
# PyTorch against CTranslate2 (float32 and int8) on a trained run's own test split, through the
# real commands: `tmt export`, then `tmt evaluate` with each backend, greedy and beam 4.
# Prints one line per backend and beam: BLEU, chrF, sentences/s of decoding (evaluate's own
# timing: model loading excluded), and the share of hypotheses identical to PyTorch's.
#   bash scripts/compare_backends.sh runs/tatoeba_en_it [OUT_DIR]
# CHECKPOINT=last (or a path) compares another checkpoint than the run's best.pt.
# [UNK] replacement is off on both sides (CTranslate2 exports do not replace), so that the
# outputs are comparable token for token. Run it on an otherwise idle machine.
set -euo pipefail
RUN=${1:?usage: compare_backends.sh RUN_DIR [OUT_DIR]}
OUT=${2:-$(mktemp -d -t compare_backends.XXXX)}
TMT=${TMT:-tmt}
CHECKPOINT=${CHECKPOINT:-best}
mkdir -p "$OUT"
for q in float32 int8; do
    [ -d "$OUT/ct2-$q" ] || $TMT export --run "$RUN" --checkpoint "$CHECKPOINT" \
        --format ctranslate2 --quantization $q --output "$OUT/ct2-$q" >/dev/null
done
for beam in 1 4; do
    # Each evaluate writes its report beside the hypotheses (NAME.json).
    $TMT evaluate --run "$RUN" --checkpoint "$CHECKPOINT" --beam $beam --no-replace-unk \
        --output "$OUT/pytorch.b$beam.txt" >/dev/null
    for q in float32 int8; do
        $TMT evaluate --model "$OUT/ct2-$q" --beam $beam \
            --output "$OUT/ct2-$q.b$beam.txt" >/dev/null
    done
done
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"{'backend':<14}{'beam':>5}{'BLEU':>8}{'chrF':>8}{'sents/s':>10}{'same as PyTorch':>18}")
for beam in (1, 4):
    reference = (out / f"pytorch.b{beam}.txt").read_text(encoding="utf-8").splitlines()
    for name in ("pytorch", "ct2-float32", "ct2-int8"):
        report = json.loads((out / f"{name}.b{beam}.json").read_text())
        lines = (out / f"{name}.b{beam}.txt").read_text(encoding="utf-8").splitlines()
        same = sum(a == b for a, b in zip(lines, reference))
        print(f"{name:<14}{beam:>5}{report['bleu']:>8.2f}{report['chrf']:>8.2f}"
              f"{report['sentences_per_s']:>10.1f}{f'{same}/{len(reference)}':>18}")
EOF
echo "outputs in $OUT"
