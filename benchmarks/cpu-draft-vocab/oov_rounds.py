"""How often a round ends at a token outside the drafter's draft vocabulary, from `treeflash bench` JSONs.

In a bench JSON each round's entry of `acceptance_lengths` covers the tokens [the target's own token (the
last round's bonus, or prefill's), the drafts accepted after it]; so a round that begins with a token
outside the draft vocabulary is one where the last round stopped at a token no draft could name.
python benchmarks/cpu-draft-vocab/oov_rounds.py DRAFT_VOCAB.json BENCH.json[.gz] ..."""
import gzip
import json
import sys


def main(vocab_file: str, benches: list[str]) -> None:
    vocab = set(json.load(open(vocab_file))["token_ids"])
    for path in benches:
        bench = json.load(gzip.open(path) if path.endswith(".gz") else open(path))
        for method in bench["methods"]:
            rounds = outside = drafted_outside = tokens = 0
            for prompt in method["per_prompt"]:
                ids, start = prompt["token_ids"], 0
                for length in prompt["acceptance_lengths"]:
                    rounds += 1
                    tokens += length
                    outside += ids[start] not in vocab
                    drafted_outside += sum(t not in vocab for t in ids[start + 1:start + length])
                    start += length
            print(f"{path}: {method['method']}: {tokens / rounds:.3f} tokens a round over {rounds} rounds; "
                  f"{outside / rounds:.3f} begin with a token outside the draft vocabulary; "
                  f"{drafted_outside} accepted drafts outside it")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
