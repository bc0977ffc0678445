#!/bin/bash
# Call 6: training (the 4-layer drafter grown from the shipped 3-layer one), first part.
test -f ~/smollm2.gguf || { echo "not warm"; exit 3; }
bash .stage/chain7/train.sh 540 0
grep -E 'data|ms/step|eval|resumed|vocab|initialised' ~/train_out.log | tail -12; ls ~/ckpt; date
