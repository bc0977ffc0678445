#!/bin/bash
# Call 7: c1.sh again, on the final code (61cbd01: top_p sorted in groups of rows).
bash benchmarks/h200-graph-pool/calls/c1.sh
