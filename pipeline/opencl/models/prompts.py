"""The LLMPerf prompt (section III-A), one per launch, and its explicit truncation.

The prompt is the paper's Alpaca-style template: the kernel source, one line per argument
(buffers by element count, scalars by value; element values are never part of it), and the
NDRange. It is deterministic: the same row always gives the same text.

Truncation: models have a token budget. Cutting the end of the prompt would drop the
argument sizes and the NDRange, which carry most of the signal, so the *code* section is
shortened first, from its end, with a marker saying how many characters were cut; only if
the prompt still does not fit with no code at all are the last argument lines dropped
(marked too). The NDRange line is always kept.
"""
from __future__ import annotations

import json

from pipeline.core.errors import DevcharError

HEADER = "Predict time for the following OpenCL kernel:\n"
TRUNCATED = "\n/* ... {n} characters truncated */\n"
ARGS_TRUNCATED = "\n... {n} more arguments truncated"
QUALIFIERS = {"global": "global", "local": "local", "constant": "constant", "scalar": "private"}
_SPACE_WORDS = {"__global", "global", "__local", "local", "__constant", "constant", "__private", "private", "*"}


def element_type(spelling: str) -> str:
    """'__global const float *' -> 'const float': the address space is the qualifier, said once."""
    return " ".join(w for w in str(spelling).replace("*", " * ").split() if w not in _SPACE_WORDS)


def argument_line(pos: int, arg: dict) -> str:
    kind = arg.get("kind")
    if kind not in QUALIFIERS:
        raise DevcharError(f"argument {arg.get('name')!r} has unknown kind {kind!r}; "
                           f"expected one of {list(QUALIFIERS)}")
    if kind == "scalar":
        return (f"Argument at position {pos} is {arg['name']}, which is {QUALIFIERS[kind]} scalar of type "
                f"{element_type(arg['type'])} with value {arg['value']}")
    return (f"Argument at position {pos} is {arg['name']}, which is {QUALIFIERS[kind]} buffer of type "
            f"{element_type(arg['type'])} with size {arg['elements']}")


def parse_args(args) -> list[dict]:
    """The `args` column: a JSON string (as stored) or an already decoded list."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as exc:
            raise DevcharError(f"launch args are not valid JSON: {args[:80]!r}") from exc
    if not isinstance(args, list):
        raise DevcharError(f"launch args must be a list of arguments; got {type(args).__name__}")
    return args


def prompt_tail(args, gsize: int, lsize: int, max_args: int | None = None) -> str:
    """Everything after the code: the inputs section and the NDRange line."""
    args = parse_args(args)
    keep = len(args) if max_args is None else min(max_args, len(args))
    lines = "\n".join(argument_line(i, a) for i, a in enumerate(args[:keep]))
    lines += ARGS_TRUNCATED.format(n=len(args) - keep) if keep < len(args) else ""
    return (f"\nGiven input:\n{lines}\nGiven kernel are executed with global size equals "
            f"cl::NDRange({int(gsize)}), local work-group size equals cl::NDRange({int(lsize)})")


def build_prompt(source: str, args, gsize: int, lsize: int, max_code_chars: int | None = None,
                 max_args: int | None = None) -> str:
    """The paper's prompt; with `max_code_chars`, the code is cut to that many characters, with
    `max_args` the argument lines to that many (both marked)."""
    code = source.strip()
    if max_code_chars is not None and len(code) > max_code_chars:
        code = code[:max_code_chars] + TRUNCATED.format(n=len(code) - max_code_chars)
    return HEADER + code + prompt_tail(args, gsize, lsize, max_args)


def code_budget(source: str, args, gsize: int, lsize: int, count_tokens, max_tokens: int) -> tuple | None:
    """(code characters, argument lines) kept so that the prompt fits max_tokens; None if it fits whole.

    The code goes first; if even no code does not fit, argument lines go from the end (and
    if the header and NDRange alone do not fit, the tokenizer's end truncation is left)."""
    if count_tokens(build_prompt(source, args, gsize, lsize)) <= max_tokens:
        return None
    n_args = len(parse_args(args))
    if count_tokens(build_prompt(source, args, gsize, lsize, 0)) > max_tokens:
        keep = next((k for k in range(n_args - 1, -1, -1)
                     if count_tokens(build_prompt(source, args, gsize, lsize, 0, k)) <= max_tokens), 0)
        return 0, keep
    lo, hi = 0, len(source.strip())  # binary search on the prefix length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(build_prompt(source, args, gsize, lsize, mid)) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo, None


def launch_prompts(rows, count_tokens=None, max_tokens: int | None = None) -> tuple[list[str], int]:
    """Prompts for every row of an opencl_launches frame, and how many had their code cut.

    Launches of one kernel share the code, and the cut depends only on how many tokens the
    tail takes, so the search runs once per (source, tail tokens)."""
    out, cut, cache = [], 0, {}
    for r in rows[["source", "args", "gsize", "lsize"]].itertuples(index=False):
        limit = None
        if count_tokens is not None and max_tokens is not None:
            key = (r.source, count_tokens(prompt_tail(r.args, r.gsize, r.lsize)))
            if key not in cache:
                cache[key] = code_budget(r.source, r.args, r.gsize, r.lsize, count_tokens, max_tokens)
            limit = cache[key]
            if count_tokens(build_prompt(r.source, r.args, r.gsize, r.lsize, *(limit or ()))) > max_tokens:
                # tokens do not always add up across the join: search this launch on its own
                limit = code_budget(r.source, r.args, r.gsize, r.lsize, count_tokens, max_tokens)
        out.append(build_prompt(r.source, r.args, r.gsize, r.lsize, *(limit or ())))
        cut += limit is not None
    return out, cut
