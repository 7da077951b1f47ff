"""Command line: `python -m xla_gpu_ops hlo --frontend jax --op paged_attention --out DIR [--zeros]`.

Builds sample inputs, dumps HLO / StableHLO (and XLA's before/after-optimizations dumps) under
DIR, prints the custom-call table, and exits 1 if no custom call of the op's targets is found.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from xla_gpu_ops import ops
from xla_gpu_ops._platform import prefer_cpu_without_gpu


def _hlo_command(args: argparse.Namespace) -> int:
    out = Path(args.out)
    # XLA reads XLA_FLAGS once, when its backend starts: set it before any framework import.
    from xla_gpu_ops import hlo

    flags = os.environ.get("XLA_FLAGS", "")
    xla_dump_dir: Path | None = None  # the caller chose where XLA dumps: do not guess
    if "--xla_dump_to" not in flags:
        xla_dump_dir = out / "xla_dump"
        os.environ["XLA_FLAGS"] = f"{flags} {hlo.xla_dump_flags(xla_dump_dir.resolve())}".strip()
    op = ops.get(args.op)
    dump = hlo.dump_op(args.frontend, op, zeros=args.zeros, xla_dump_dir=xla_dump_dir)
    written = dump.write(out)
    print(f"# {args.frontend} / {op.name}{' (all-zero constant inputs)' if args.zeros else ''}")
    for note in dump.notes:
        print(f"# note: {note.splitlines()[0] if note else note}")
    targets = {op.ffi_target, op.legacy_target}
    found_any = False
    for source, calls in dump.custom_calls().items():
        ours = [call for call in calls if call.target in targets]
        found_any |= bool(ours)
        if calls:
            print(f"\n## {source}\n{hlo.format_table(calls)}")
        elif source in ("hlo", "stablehlo", "after_optimizations"):
            print(
                f"\n## {source}: no custom call"
                + ("" if getattr(dump, source) else " (not produced)")
            )
    print(
        f"\nwrote {len(written)} files to {out}"
        + (f", XLA dumps in {xla_dump_dir}" if xla_dump_dir else "")
    )
    if not found_any:
        print(f"error: no custom call with target {sorted(targets)} found", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    prefer_cpu_without_gpu()
    parser = argparse.ArgumentParser(prog="python -m xla_gpu_ops")
    commands = parser.add_subparsers(dest="command", required=True)
    hlo_parser = commands.add_parser(
        "hlo", help="dump HLO/StableHLO of an op and list its custom calls"
    )
    hlo_parser.add_argument(
        "--frontend",
        choices=("torch_xla", "jax", "torchax"),
        required=True,
        help="the front end that lowers the op's sample call",
    )
    hlo_parser.add_argument(
        "--op",
        choices=list(ops.BY_NAME),
        required=True,
        help="an op of the table (xla_gpu_ops.ops); its sample call is dumped",
    )
    hlo_parser.add_argument("--out", required=True, help="folder for the dumps")
    hlo_parser.add_argument(
        "--zeros", action="store_true", help="all-zero inputs baked in as graph constants"
    )
    args = parser.parse_args(argv)
    if args.command == "hlo":
        return _hlo_command(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
