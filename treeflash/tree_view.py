"""Drawing a round's draft tree with its accepted path marked (for `treeflash generate --show-tree`)."""

from __future__ import annotations

from typing import Callable

from treeflash.tree import DraftTree, Walk


def render_tree(tree: DraftTree, walk: Walk, slot: int, token_text: Callable[[int], str], max_children: int = 8,
                drafted: int | None = None) -> str:
    """The tree of `slot`, one node a line; nodes from `drafted` on (prompt lookup's) are marked as such."""
    tokens = tree.tokens[slot].tolist()
    parents = tree.parents[slot].tolist()
    valid = tree.valid[slot].tolist()
    scores = tree.scores[slot].tolist()
    accepted = int(walk.accepted[slot])
    path = set(walk.path[slot, :accepted].tolist())
    bonus = walk.emitted[slot, accepted - 1].item()
    children: dict[int, list[int]] = {}
    for node in range(1, len(tokens)):
        if valid[node]:
            children.setdefault(parents[node], []).append(node)

    drafted = len(tokens) if drafted is None else drafted
    looked = sum(valid[drafted:])
    lines = [f"root {token_text(tokens[0])}  ({sum(valid[:drafted]) - 1} draft nodes"
             + (f" + {looked} from prompt lookup" if looked else "")
             + f", {accepted - 1} accepted, bonus {token_text(bonus)})"]

    def draw(node: int, indent: str) -> None:
        kids = children.get(node, [])
        shown = kids[:max_children]
        for n, child in enumerate(shown):
            last = n == len(shown) - 1 and len(kids) <= max_children
            mark = "*" if child in path else " "
            lines.append(f"{indent}{'└─' if last else '├─'}{mark} {token_text(tokens[child])}  "
                         + ("(lookup)" if child >= drafted else f"log q={scores[child]:.2f}"))
            draw(child, indent + ("   " if last else "│  "))
        if len(kids) > max_children:
            lines.append(f"{indent}└─  ... {len(kids) - max_children} more")

    draw(0, "")
    lines.append("(* = accepted path; log q = drafter log-probability of the prefix"
                 + ("; lookup = copied from earlier in the text)" if looked else ")"))
    return "\n".join(lines)
