#!/bin/bash
# Call 4: where a tree's splitkv call spends its time: leave-one-out variants (cold, 36 layers' caches) with the
# compiled kernels' registers/spills/shared memory, then ncu on one call per shape.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 150 python3 .stage/cold/variants.py > $OUT/variants.txt 2>&1; echo "variants rc $?"; cat $OUT/variants.txt | cut -c1-200
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
timeout 200 $NCU --clock-control none -k "regex:_partial|_merge" --launch-skip 0 --launch-count 12 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis python3 .stage/cold/diag.py > $OUT/ncu.txt 2>&1
echo "ncu rc $?"; grep -E "_partial|_merge|Duration|Registers Per|Achieved Occupancy|Theoretical Occ|Memory Throughput|DRAM Through|Compute \(SM\)|Block Limit|Warp Cycles Per Issued|Stall|Dynamic Shared|Grid Size|L2 Hit|L1/TEX Hit|Local" $OUT/ncu.txt | head -150
