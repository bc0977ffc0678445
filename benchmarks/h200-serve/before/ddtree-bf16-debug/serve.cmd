python3 -m treeflash.cli serve /root/smollm2.gguf --max-num-seqs 32 --port 8100 --log-level warning --draft-model /root/d13 --debug --log-level info
