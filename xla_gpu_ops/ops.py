"""The op table: every op of the library, named once, with its operands, attributes and results.

Everything else derives from it: the torch.library schema and kernels (torch_ops), the JAX
`ffi_call` (jax), the torchax lowering (torchax), the torch_xla custom call (torch_xla), the
XgoCall the library reads (_library), the HLO tool's sample calls (hlo) and the XLA targets.
The library exports its own table (c_api.h); `_library.load` checks that the two agree.

Importing this module needs numpy only.
"""

from __future__ import annotations

import inspect
import itertools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NAMESPACE = "xla_gpu"
# An optional operand given as None reaches the library as an empty array of this dtype, [0].
ABSENT_DTYPE = "float32"
_FLOAT32_MAX = float(np.finfo(np.float32).max)
REQUIRED = inspect.Parameter.empty


def is_absent(value: Any) -> bool:
    """True for an optional operand left out: None, or the empty [0] array that stands for it."""
    return value is None or tuple(getattr(value, "shape", ())) == (0,)


@dataclass(frozen=True)
class Operand:
    name: str
    rank: int
    dtypes: str  # the rule, for docs: "float32, float16 or bfloat16", "int32", "query's"
    doc: str  # the dims, e.g. "[T, Hq, D]"
    host_ok: bool = False  # eager torch: may be a host tensor, copied to the device per call
    # Values the library's check_host_values reads (metadata the GPU path only guards); the
    # optional eager validation copies just these to the host.
    values_checked: bool = False
    # An optional operand may be None: the front ends pass an empty float32 [0] array for it (the
    # library reads that as absent), so every custom call has the same operands. Optional
    # operands come last in the table; callers give them by keyword, after the attributes.
    optional: bool = False
    # What clients hand over besides the library's dtype: the public functions convert these
    # dtypes to `cast_to` before the call (a server's int64 metadata, a model's bf16 sinks), and
    # a host_ok operand may also be a Python int (num_seqs). The library only sees cast_to.
    converts: tuple[str, ...] = ()
    cast_to: str = ""
    # Read where it lies, never copied (a KV cache: a copy per call would move all of it): eager
    # CUDA refuses a view the kernels cannot read, naming what to pass instead.
    in_place: bool = False
    # Ranks accepted besides `rank` (kv_cache: 5, K and V in one tensor); `rank` is the one the
    # sharding wrappers split.
    other_ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Attr:
    """A static attribute. `none` is what the library reads when the user passes None (for
    sliding_window 0: no window; for k_scale 1.0); attributes without one cannot be None.
    `positive` attributes must be > 0 when given. An attribute with a `tensor` operand also takes
    a tensor, which the public functions pass as that operand."""

    name: str
    kind: type  # float, int, or str (one of `choices`, which the library reads as its index)
    doc: str
    default: Any = REQUIRED
    none: float | int | None = None
    positive: bool = False
    # The optional operand a tensor given for this attribute goes to (k_scale -> k_scales): read
    # by the kernels at run time, so a new value neither retraces nor recompiles.
    tensor: str = ""
    choices: tuple[str, ...] = ()

    def encode(self, op: str, value: Any) -> float | int:
        """The value the library reads; TypeError / ValueError naming the attribute."""
        if self.kind is str:
            if value not in self.choices:
                raise ValueError(
                    f"{op}: {self.name}: must be one of {', '.join(map(repr, self.choices))}, "
                    f"got {value!r}"
                )
            return self.choices.index(value)
        if value is None:
            if self.none is None:
                raise TypeError(f"{op}: {self.name}: must be a {self.kind.__name__}, got None")
            return self.none
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"{op}: {self.name}: must be a static Python {self.kind.__name__}"
                f"{' or None' if self.none is not None else ''}, got {value!r} "
                "(under jax.jit pass it through static_argnames or functools.partial)"
            )
        if self.kind is int:
            if not isinstance(value, numbers.Integral):
                raise TypeError(f"{op}: {self.name}: must be an int, got {value!r}")
            value = int(value)
            if not -(2**63) <= value < 2**63:
                raise ValueError(f"{op}: {self.name}: must fit in int64, got {value!r}")
        else:
            value = float(value)
            if not (math.isfinite(value) and abs(value) <= _FLOAT32_MAX):
                raise ValueError(f"{op}: {self.name}: must be finite (a float32), got {value!r}")
        if self.positive and value <= 0:
            none = " or None" if self.none is not None else ""
            raise ValueError(f"{op}: {self.name}: must be > 0{none}, got {value!r}")
        return value

    @property
    def schema_type(self) -> str:
        base = {float: "float", int: "int", str: "str"}[self.kind]
        return base + ("?" if self.none is not None else "")


@dataclass(frozen=True)
class Like:
    """A returned result's shape and dtype, from an operand: the operand's leading `rank` dims
    (None: all of them) and `dtype` (None: the operand's). Sharded like the operand too."""

    operand: str
    rank: int | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class Op:
    name: str
    operands: tuple[Operand, ...]
    attrs: tuple[Attr, ...]
    # Results in the library's order. The first `returned` are the op's outputs; the rest are
    # scratch space the library sizes (the CUDA handlers never allocate) and callers drop.
    results: tuple[str, ...]
    # Each returned result that is not aliased has the shape and dtype of this operand, or what a
    # Like says (the fake / meta kernels of the torch op, the sharding wrappers' specs).
    result_like: tuple[str | Like, ...]
    doc: str
    returned: int = 1
    # Results written in place into an operand: {result index: operand index}. The torch op
    # mutates that operand and does not return it; JAX aliases the buffers (donate the operand
    # to update it without a copy) and returns the result.
    # jax.ffi vmap_method: "broadcast_all" for elementwise ops, "sequential" otherwise.
    vmap_method: str = "sequential"
    aliases: Mapping[int, int] = field(default_factory=dict)
    # Returned results the public functions return only when asked (`return_<name>=True`), after
    # the others, {result: what it is}: paged_attention's LSE. The op itself (torch op, custom
    # call) always returns them.
    on_request: Mapping[str, str] = field(default_factory=dict)
    # The public functions take every argument by keyword: for ops whose operands a positional
    # slip would mix up silently (key and value of one shape); an error then names the argument.
    keyword_only: bool = False
    # One valid call's operands, (zeros) -> {operand: array}; zeros=True: every operand zero (the
    # call a constant folder would fold). The HLO checks and every front end's tests use it.
    sample: Callable[[bool], dict[str, np.ndarray]] | None = field(default=None, compare=False)
    sample_attrs: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # Derived from the fields above in __post_init__, not arguments.
    num_required: int = field(init=False, repr=False, compare=False)
    optional_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    call_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _keyword_template: dict[str, Any] = field(init=False, repr=False, compare=False)
    _required_attrs: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # (index, operand) of the operands the public functions convert (Operand.converts)
    converted: tuple[tuple[int, Operand], ...] = field(init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ derived names
    @property
    def ffi_target(self) -> str:
        """Typed FFI custom-call target (api_version 4), registered for CUDA and Host."""
        return f"{NAMESPACE}_{self.name}"

    @property
    def legacy_target(self) -> str:
        """Legacy status-returning target (api_version 2), CUDA only."""
        return f"{NAMESPACE}_{self.name}_legacy"

    @property
    def qualname(self) -> str:
        """torch.library name, e.g. xla_gpu::paged_attention."""
        return f"{NAMESPACE}::{self.name}"

    @property
    def operand_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.operands)

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    @property
    def mutated(self) -> tuple[str, ...]:
        """Operands the op updates in place (the torch op mutates them)."""
        return tuple(self.operands[i].name for i in self.aliases.values())

    @property
    def functional_name(self) -> str:
        """torch op that returns in-place results as new tensors (ops with aliases only): what
        functionalization (torch_xla, torch.compile, torch.export) records instead."""
        return f"{self.name}_functional"

    def functional_schema(self) -> str:
        return self._schema(mutable=False, returns=self.returned)

    @property
    def returned_like(self) -> tuple[str, ...]:
        """Per returned result, the operand it takes its shape, dtype and sharding from: the
        aliased operand for an in-place result, else the next entry of result_like."""
        return tuple(like.operand for like in self.returned_specs)

    @property
    def returned_specs(self) -> tuple[Like, ...]:
        """Per returned result, its Like (the aliased operand, whole, for an in-place result)."""
        like = iter(self.result_like)
        specs = []
        for i in range(self.returned):
            spec = Like(self.operands[self.aliases[i]].name) if i in self.aliases else next(like)
            specs.append(Like(spec) if isinstance(spec, str) else spec)
        return tuple(specs)

    def returned_ranks(self) -> list[int]:
        """Per returned result, its rank (-1: any, as its operand's)."""
        return [
            self.operands[self.operand_names.index(spec.operand)].rank
            if spec.rank is None
            else spec.rank
            for spec in self.returned_specs
        ]

    def public_returns(self, asked: Sequence[bool] = ()) -> Callable[[Any], Any]:
        """picks what a public function returns from the op's returned results (library order):
        every result but the on_request ones not asked for (`asked`: one flag per on_request
        name); one result alone, else a tuple. Made once per call site's flags."""
        names = list(self.on_request)
        keep = [
            i
            for i, name in enumerate(self.results[: self.returned])
            if name not in names or asked[names.index(name)]
        ]
        if keep == list(range(self.returned)):
            return lambda outs: outs
        if len(keep) == 1:
            (index,) = keep
            return lambda outs: outs[index]
        return lambda outs: tuple(outs[i] for i in keep)

    def given_returns(self, operands: Sequence[Any]) -> tuple[int, ...]:
        """Indices of the returned results a call gives back (operands in table order): all but
        those written in place into an optional operand left out (is_absent), e.g. kv_cache_update's
        value_cache when K and V share one interleaved cache."""
        return tuple(
            i
            for i in range(self.returned)
            if i not in self.aliases or not is_absent(operands[self.aliases[i]])
        )

    def given_writes(self, operands: Sequence[Any]) -> tuple[tuple[int, int], ...]:
        """(result, operand) of each result written in place into an operand the call gives
        (operands in table order; not an optional one left out)."""
        return tuple((r, o) for r, o in self.aliases.items() if not is_absent(operands[o]))

    @property
    def torch_returns(self) -> tuple[int, ...]:
        """Indices of the results the torch op returns: the outputs that are not in place."""
        return tuple(i for i in range(self.returned) if i not in self.aliases)

    def torch_result(self, functional: bool = False) -> Callable[[Sequence[Any]], Any]:
        """picks what the torch op (functional: its functional twin) returns from the op's
        returned results in library order: None when every result is written in place, else one
        tensor or a tuple. Made once per kernel: the eager path calls it on every call."""
        returns = tuple(range(self.returned)) if functional else self.torch_returns
        if not returns:
            return lambda outs: None
        if len(returns) == 1:
            (index,) = returns
            return lambda outs: outs[index]
        return lambda outs: tuple(outs[i] for i in returns)

    def schema(self) -> str:
        """The torch.library schema, e.g. "(Tensor query, ..., float scale, int? w=None) -> Tensor"."""
        return self._schema(mutable=True, returns=len(self.torch_returns))

    def _schema(self, mutable: bool, returns: int) -> str:
        # one alias set per operand written in place: (a!), (b!), ...
        mutated = self.mutated if mutable else ()
        written = {name: f"({chr(ord('a') + i)}!)" for i, name in enumerate(mutated)}
        params = [
            f"Tensor{written.get(o.name, '')} {o.name}" for o in self.operands[: self.num_required]
        ]
        for a in self.attrs:
            default = "" if a.default is REQUIRED else f"={a.default!r}"
            params.append(f"{a.schema_type} {a.name}{default}")
        params += [
            f"Tensor{written.get(o.name, '')}? {o.name}=None"
            for o in self.operands[self.num_required :]
        ]
        result = "Tensor" if returns == 1 else f"({', '.join(['Tensor'] * returns)})"
        return f"({', '.join(params)}) -> {result}"

    def docstring(self, extras: Sequence[Extra] = (), note: str = "") -> str:
        """The public functions' docstring, from the table: what the op does, then each argument
        (operands with their dims and dtypes, attributes, the front end's extras)."""
        lines = [self.doc.strip(), "", "Arguments:"]
        for o in self.operands:
            optional = ", or None" if o.optional else ""
            lines.append(f"    {o.name}: {o.doc}; {o.dtypes}{optional}")
        for a in self.attrs:
            default = "required" if a.default is REQUIRED else f"default {a.default!r}"
            lines.append(f"    {a.name} ({a.kind.__name__}, {default}): {a.doc}")
        for name, doc in self.on_request.items():
            lines.append(f"    return_{name} (default False): also return {name}: {doc}")
        for e in extras:
            lines.append(f"    {e.name} (default {e.default!r}): {e.doc}")
        return "\n".join(lines + (["", note.strip()] if note else []))

    def sample_call(self, zeros: bool = False) -> dict[str, np.ndarray]:
        """The operands of the op's sample call (every operand zero when zeros is True)."""
        assert self.sample is not None  # __post_init__ refuses an Op without one
        return self.sample(zeros)

    # ------------------------------------------------------------------ calls
    def __post_init__(self) -> None:
        if self.sample is None:
            raise TypeError(
                f"{self.name}: no sample: give Op(sample=...) in xla_gpu_ops/ops.py, a function "
                "(zeros: bool) -> {operand: numpy array} making one valid call (every operand "
                "zero when zeros is True); the HLO checks and the tests of every front end use it"
            )
        required = [o for o in self.operands if not o.optional]
        object.__setattr__(
            self, "converted", tuple((i, o) for i, o in enumerate(self.operands) if o.converts)
        )
        if self.operands[: len(required)] != tuple(required):
            raise ValueError(f"{self.name}: optional operands must come last in the table")
        object.__setattr__(self, "num_required", len(required))
        optional = tuple(o.name for o in self.operands[len(required) :])
        object.__setattr__(self, "optional_names", optional)
        # The call order: required operands, attributes, optional operands (as the schema).
        object.__setattr__(
            self, "call_names", self.operand_names[: len(required)] + self.attr_names + optional
        )
        # What `bind` reads on every call, built once as a plain dict and tuple: torch.compile
        # traces the public wrappers, and dynamo cannot trace a cached_property's lock (Python
        # 3.11) nor compare a frozenset with dict keys. Required attributes map to REQUIRED,
        # optional operands to None.
        template = {a.name: a.default for a in self.attrs} | dict.fromkeys(optional)
        object.__setattr__(self, "_keyword_template", template)
        required_attrs = tuple(a.name for a in self.attrs if a.default is REQUIRED)
        object.__setattr__(self, "_required_attrs", required_attrs)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list, dict]:
        """(operands in table order, {attribute: value}) from a call's arguments, as Python
        binds them (required operands, attributes, optional operands; an optional operand left
        out is None); TypeError naming a missing, unknown or repeated argument."""
        # The common call, required operands positional and the rest by keyword, costs one dict
        # merge and two length checks (no unknown keyword when the merge adds no key): the
        # public wrappers run this on every eager call, and dynamo traces it as constants.
        given = {**self._keyword_template, **kwargs}
        if len(args) == self.num_required and len(given) == len(self._keyword_template):
            for name in self._required_attrs:
                if given[name] is REQUIRED:
                    break
            else:
                operands = list(args)
                for name in self.optional_names:
                    operands.append(given.pop(name))
                return operands, given
        names = self.call_names
        if len(args) > len(names):
            raise TypeError(f"{self.name}: takes {len(names)} arguments, got {len(args)}")
        # zip(strict=True) over equal lengths: dynamo (torch 2.9) reads any strict= as true
        bound = dict(zip(names[: len(args)], args, strict=True))
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError(f"{self.name}: unexpected argument {key!r}")
            if key in bound:
                raise TypeError(f"{self.name}: {key}: given twice")
            bound[key] = value
        for name in self.operand_names[: self.num_required]:
            if name not in bound:
                raise TypeError(f"{self.name}: {name}: missing")
        attrs = {}
        for a in self.attrs:
            if a.name in bound:
                attrs[a.name] = bound[a.name]
            elif a.default is REQUIRED:
                raise TypeError(f"{self.name}: {a.name}: missing")
            else:
                attrs[a.name] = a.default
        return [bound.get(n) for n in self.operand_names], attrs

    def attrs_from(self, values: Sequence[Any]) -> dict[str, Any]:
        """{attribute: value} from the leading attribute values in table order; the attributes
        left out take their defaults."""
        attrs = dict(zip(self.attr_names[: len(values)], values, strict=True))
        for a in self.attrs[len(values) :]:
            attrs[a.name] = a.default
        return attrs

    def split_schema_args(self, args: Sequence[Any]) -> tuple[list, dict]:
        """(operands in table order, {attribute: value}) from a kernel's positional arguments in
        schema order; the dispatcher leaves out trailing arguments that equal their defaults
        (an optional operand left out is None)."""
        n, end = self.num_required, self.num_required + len(self.attrs)
        optional = list(args[end:])
        optional += [None] * (len(self.optional_names) - len(optional))
        return [*args[:n], *optional], self.attrs_from(args[n:end])

    def complete(self, operands: Sequence[Any]) -> list:
        """Operands in table order with the optional ones a caller left off the end as None;
        TypeError when a required one is missing or there are too many."""
        if not self.num_required <= len(operands) <= len(self.operands):
            raise TypeError(
                f"{self.name}: takes {self.num_required} to {len(self.operands)} operands "
                f"({', '.join(self.operand_names)}), got {len(operands)}"
            )
        return [*operands, *[None] * (len(self.operands) - len(operands))]

    def split_optional(self, operands: Sequence[Any]) -> tuple[list, dict[str, Any]]:
        """(required operands, {optional operand: value}) from operands in table order: how the
        reference and the composite take them (optional operands by keyword)."""
        n = self.num_required
        return list(operands[:n]), dict(zip(self.optional_names, operands[n:], strict=True))

    def schema_args(self, operands: Sequence[Any], attrs: Mapping[str, Any]) -> list:
        """The positional arguments of the torch op: required operands, attribute values (their
        defaults where left out), optional operands (None where absent)."""
        n = self.num_required
        values = [attrs.get(a.name, a.default) for a in self.attrs]
        return [*operands[:n], *values, *operands[n:]]

    def route_tensors(self, operands: list, attrs: dict) -> tuple[list, dict]:
        """(operands, attrs) with each attribute given as a tensor or array (not a number, not
        None) moved to its `tensor` operand, the attribute then None; TypeError naming the
        attribute when that operand is given too."""
        for a in self.attrs:
            value = attrs[a.name]
            if not a.tensor or value is None or isinstance(value, numbers.Real):
                continue
            index = self.operand_names.index(a.tensor)
            if operands[index] is not None:
                raise TypeError(
                    f"{self.name}: {a.name}: a tensor here and {a.tensor} as well; give one"
                )
            if getattr(value, "ndim", None) == 0:  # a 0-d scalar tensor: one scale for all
                value = value.reshape(1)
            operands[index], attrs[a.name] = value, None
        return operands, attrs

    def encode_attrs(self, attrs: Mapping[str, Any]) -> tuple[float | int, ...]:
        """The values the library reads, in table order (None -> the attribute's `none` value);
        attributes left out take their defaults."""
        values = []
        for a in self.attrs:
            if a.name not in attrs and a.default is REQUIRED:
                raise TypeError(f"{self.name}: {a.name}: missing")
            values.append(a.encode(self.name, attrs.get(a.name, a.default)))
        return tuple(values)


@dataclass(frozen=True)
class Extra:
    """A front end's own keyword-only parameter of the public functions (torch: validate)."""

    name: str
    default: Any
    doc: str


def public_function(
    op: Op,
    forward: Callable[..., Any],
    extras: Sequence[Extra] = (),
    module: str = __name__,
    doc: str = "",
) -> Callable[..., Any]:
    """The public function of `op` for one front end, made from the table: a real Python function
    (inspect, help and torch.compile see its parameters) whose parameters are the required
    operands, then keyword-only the attributes (with their defaults) and the optional operands
    (default None), then the `extras`. It calls forward(operands in table order, {attribute:
    value}, **extras): Python has bound the arguments, so the call costs no binding of ours."""
    required = list(op.operand_names[: op.num_required])
    params = ["*", *required] if op.keyword_only else [*required, "*"]
    namespace: dict[str, Any] = {"_forward": forward}
    for i, a in enumerate(op.attrs):
        if a.default is REQUIRED:
            params.append(a.name)
        else:
            namespace[f"_default{i}"] = a.default
            params.append(f"{a.name}=_default{i}")
    params += [f"{name}=None" for name in op.optional_names]
    params += [f"return_{name}=False" for name in op.on_request]
    for i, extra in enumerate(extras):
        namespace[f"_extra{i}"] = extra.default
        params.append(f"{extra.name}=_extra{i}")
    if params[-1] == "*":  # no keyword parameter: a bare * would be a syntax error
        params.pop()
    operands = ", ".join(op.operand_names)
    attrs = ", ".join(f"{a.name!r}: {a.name}" for a in op.attrs)
    keywords = "".join(f", {e.name}={e.name}" for e in extras)
    call = f"_forward([{operands}], {{{attrs}}}{keywords})"
    if any(a.tensor for a in op.attrs):  # tensor-valued attributes become their operands
        namespace["_route"] = op.route_tensors
        call = f"_forward(*_route([{operands}], {{{attrs}}}){keywords})"
    if op.on_request:  # the results asked for: one picker per combination of the flags
        flags = [f"return_{name}" for name in op.on_request]
        namespace["_picks"] = {
            asked: op.public_returns(asked)
            for asked in itertools.product((False, True), repeat=len(flags))
        }
        call = f"_picks[({''.join(f'bool({f}), ' for f in flags)})]({call})"
    source = f"def {op.name}({', '.join(params)}):\n    return {call}\n"
    exec(compile(source, f"<xla_gpu_ops.ops: {op.name}>", "exec"), namespace)
    function = namespace[op.name]
    function.__module__ = module
    function.__qualname__ = op.name
    function.__doc__ = op.docstring(extras, doc)
    return function


# ---------------------------------------------------------------------------- sample calls
def _simple_add_sample(zeros: bool) -> dict[str, np.ndarray]:
    shape = (4, 256)
    if zeros:
        return {"a": np.zeros(shape, np.float32), "b": np.zeros(shape, np.float32)}
    rng = np.random.default_rng(0)
    return {
        "a": rng.standard_normal(shape, np.float32),
        "b": rng.standard_normal(shape, np.float32),
    }


def _paged_attention_sample(zeros: bool) -> dict[str, np.ndarray]:
    """3 live sequences (decode, prefill, chunked prefill), 1 unused slot, 2 padding rows;
    Hq=8, Hkv=2, head_dim=64, page_size=16, float32, pages in reverse order. zeros=True makes every
    input all zeros, metadata included (num_seqs = 0, a valid empty batch): the case where a graph
    built from constants could be folded into a constant. Scales per KV head (k_scales, v_scales;
    absent, [0], in the zero call); K and V in caches of their own (kv_cache, value_cache: the
    interleaved cache has tests of its own everywhere)."""
    seqs = [(1, 37), (17, 17), (3, 64)]  # (q_len, context_len)
    num_q_heads, num_kv_heads, head_dim, page_size, pad_tokens, spare_slots = 8, 2, 64, 16, 2, 1
    pages_per_seq = max(-(-ctx // page_size) for _, ctx in seqs)
    num_slots = len(seqs) + spare_slots
    num_pages = num_slots * pages_per_seq
    num_tokens = sum(q for q, _ in seqs) + pad_tokens
    shapes = [
        ((num_tokens, num_q_heads, head_dim), np.float32),
        ((num_pages, page_size, num_kv_heads, head_dim), np.float32),  # K
        ((num_slots,), np.int32),
        ((num_slots, pages_per_seq), np.int32),
        ((num_slots + 1,), np.int32),
        ((1,), np.int32),
        ((num_q_heads,), np.float32),
        ((0 if zeros else num_kv_heads,), np.float32),
        ((0 if zeros else num_kv_heads,), np.float32),
        ((num_pages, page_size, num_kv_heads, head_dim), np.float32),  # V
    ]
    sample = {
        name: np.zeros(shape, dtype)
        for name, (shape, dtype) in zip(PAGED_ATTENTION.operand_names, shapes, strict=True)
    }
    if not zeros:
        rng = np.random.default_rng(0)
        for name in ("query", "kv_cache", "sinks", "value_cache"):
            sample[name][...] = rng.standard_normal(sample[name].shape, np.float32)
        sample["block_tables"][...] = np.arange(num_pages, dtype=np.int32)[::-1].reshape(
            num_slots, pages_per_seq
        )
        sample["context_lens"][: len(seqs)] = [ctx for _, ctx in seqs]
        sample["context_lens"][len(seqs) :] = 1
        starts = sample["query_start_loc"]
        starts[1 : len(seqs) + 1] = np.cumsum([q for q, _ in seqs])
        starts[len(seqs) + 1 :] = starts[len(seqs)]
        sample["num_seqs"][0] = len(seqs)
        sample.update(_scales_sample(rng, num_kv_heads))
    return sample


def _scales_sample(rng: np.random.Generator, num_kv_heads: int) -> dict[str, np.ndarray]:
    """k_scales and v_scales per KV head, around 1 and never equal."""
    return {
        name: rng.uniform(0.5, 2.0, (num_kv_heads,)).astype(np.float32)
        for name in ("k_scales", "v_scales")
    }


_FLOATS = "float32, float16 or bfloat16"
_KV_CACHE = (
    "[P, page_size, 2*Hkv, D] (K even, V odd heads); with value_cache: K alone, "
    "[P, page_size, Hkv, D]; or [P, 2, page_size, Hkv, D], K at [:, 0] and V at [:, 1] "
    "(FlashInfer's one tensor, vLLM's FlashInfer backend)"
)
KV_LAYOUT = Attr(
    "kv_layout",
    str,
    'the order of each cache\'s dims: "NHD" [P, page_size, heads, D] (vLLM FlashAttention, '
    'torch_xla), or "HND" [P, heads, page_size, D] (FlashInfer\'s other layout; one tensor: '
    "[P, 2, Hkv, page_size, D]); heads: 2*Hkv interleaved, or Hkv with value_cache",
    "NHD",
    choices=("NHD", "HND"),
)


def _scale_attrs(k_doc: str, v_doc: str) -> tuple[Attr, Attr]:
    """k_scale and v_scale: > 0, None for 1, or a float32 tensor [], [1] or [Hkv] that the public
    functions pass as k_scales / v_scales (read at run time)."""
    tensor = "; or a float32 tensor [], [1] or [Hkv], read at run time"
    return (
        Attr("k_scale", float, k_doc + tensor + " (k_scales)", None, 1.0, True, "k_scales"),
        Attr("v_scale", float, v_doc + tensor + " (v_scales)", None, 1.0, True, "v_scales"),
    )


# Dequantisation scales as tensors (vLLM's k_scale / v_scale, per tensor or per KV head).
_SCALES = "float32"
K_SCALES = Operand(
    "k_scales",
    1,
    _SCALES,
    "[Hkv] or [1]: key scales per KV head (or one for all), read at run time; None: none. Also "
    "what a tensor k_scale becomes",
    optional=True,
)
V_SCALES = Operand(
    "v_scales",
    1,
    _SCALES,
    "[Hkv] or [1]: value scales per KV head (or one), as k_scales; a tensor v_scale becomes it",
    optional=True,
)
# Metadata: the library reads int32; the public functions also take int64 (converted on the way).
_INDEX = "int32 (int64: converted)"
_INT64 = ("int64",)

SIMPLE_ADD = Op(
    name="simple_add",
    operands=(
        Operand("a", -1, _FLOATS, "any shape"),
        Operand("b", -1, "a's", "a's shape"),
    ),
    attrs=(),
    results=("out",),
    result_like=("a",),
    doc="out = a + b (same shape and dtype), formed in float32 and rounded once to the input dtype.",
    vmap_method="broadcast_all",  # elementwise: batching both operands is exact
    sample=_simple_add_sample,
)

PAGED_ATTENTION = Op(
    name="paged_attention",
    operands=(
        Operand("query", 3, _FLOATS, "[T, Hq, D]"),
        Operand(
            "kv_cache",
            4,
            "query's or float8_e4m3fn",
            _KV_CACHE,
            in_place=True,
            other_ranks=(5,),
        ),
        Operand(
            "context_lens", 1, _INDEX, "[S]", values_checked=True, converts=_INT64, cast_to="int32"
        ),
        Operand(
            "block_tables",
            2,
            _INDEX,
            "[S, pages_per_seq]",
            values_checked=True,
            converts=_INT64,
            cast_to="int32",
        ),
        Operand(
            "query_start_loc",
            1,
            _INDEX,
            "[S + 1]",
            values_checked=True,
            converts=_INT64,
            cast_to="int32",
        ),
        Operand(
            "num_seqs",
            1,
            _INDEX + " (or a Python int)",
            "[1]",
            host_ok=True,
            values_checked=True,
            converts=_INT64,
            cast_to="int32",
        ),
        Operand(
            "sinks",
            1,
            "float32 (float16, bfloat16: read as float32)",
            "[Hq]: a logit per query head that joins the softmax and adds no value; None: none",
            optional=True,
            converts=("float16", "bfloat16"),
            cast_to="float32",
        ),
        K_SCALES,
        V_SCALES,
        Operand(
            "value_cache",
            4,
            "kv_cache's",
            "[P, page_size, Hkv, D]: V apart from K (kv_cache then holds K alone, the same shape: "
            "vLLM's cache.unbind(0), transformers' paged cache); None: interleaved in kv_cache",
            optional=True,
            in_place=True,
        ),
    ),
    attrs=(
        Attr("scale", float, "logits multiplier"),
        Attr(
            "sliding_window", int, "keys older than this many positions are masked", None, 0, True
        ),
        Attr("soft_cap", float, "logits -> soft_cap * tanh(logits / soft_cap)", None, 0.0, True),
        *_scale_attrs(
            "key dequantisation scale: logits * k_scale",
            "value dequantisation scale: out * v_scale",
        ),
        KV_LAYOUT,
    ),
    results=("out", "lse", "workspace"),
    result_like=("query", Like("query", 2, "float32")),
    returned=2,
    on_request={
        "lse": "float32 [T, Hq], the log-sum-exp of each row's logits (natural log, after scale "
        "and soft cap, its sink included): merge_attention_states' input; -inf on rows past "
        "query_start_loc[num_seqs]"
    },
    doc="""Ragged paged attention, torch_xla's `ragged_paged_attention` semantics (docs/DESIGN.md).

Returns out [T, Hq, D] in query's dtype; rows at or past query_start_loc[num_seqs] are zero. A
float8_e4m3fn kv_cache needs a float16 or bfloat16 query on CUDA (any query on the CPU paths); its
dequantisation scales are k_scale and v_scale. Sinks are not scaled and not capped.""",
    sample=_paged_attention_sample,
    sample_attrs={
        "scale": 0.125,
        "sliding_window": None,
        "soft_cap": None,
        "k_scale": None,
        "v_scale": None,
    },
)


def _kv_cache_update_sample(zeros: bool) -> dict[str, np.ndarray]:
    """6 new rows (one padding slot) for an interleaved cache of 4 pages of 8 rows, Hkv=2,
    head_dim=64 (kv_cache_store's sample writes into separate K and V caches)."""
    num_pages, page_size, combined_heads, head_dim, num_tokens = 4, 8, 4, 64, 6
    arrays = [
        np.zeros((num_tokens, combined_heads, head_dim), np.float32),
        np.zeros((num_tokens,), np.int32),
        np.zeros((num_pages, page_size, combined_heads, head_dim), np.float32),
    ]
    if not zeros:
        rng = np.random.default_rng(0)
        new_kv, slot_mapping, kv_cache = arrays
        new_kv[...] = rng.standard_normal(new_kv.shape, np.float32)
        kv_cache[...] = rng.standard_normal(kv_cache.shape, np.float32)
        slot_mapping[...] = [3, 17, -1, 8, 31, 0]
    absent = [np.zeros((0,), np.float32) for _ in range(3)]  # k/v_scales, value_cache: none
    sample = dict(zip(KV_CACHE_UPDATE.operand_names, arrays + absent, strict=True))
    if not zeros:
        sample.update(_scales_sample(np.random.default_rng(1), combined_heads // 2))
    return sample


def _value_cache_written(cache: str) -> Operand:
    return Operand(
        "value_cache",
        4,
        "kv_cache's",
        f"[P, page_size, Hkv, D]: V's cache, apart from K ({cache} then holds K alone, the same "
        "shape: vLLM's key_cache, value_cache); updated in place; None: V interleaved in kv_cache",
        optional=True,
    )


KV_CACHE_UPDATE = Op(
    name="kv_cache_update",
    operands=(
        Operand("new_kv", 3, _FLOATS, "[N, 2*Hkv, D] (K even, V odd heads: one cache row each)"),
        Operand(
            "slot_mapping",
            1,
            "int32 or int64",
            "[N]: page * page_size + row; < 0 skips",
            values_checked=True,
        ),
        Operand("kv_cache", 4, "new_kv's or float8_e4m3fn", _KV_CACHE, other_ranks=(5,)),
        K_SCALES,
        V_SCALES,
        _value_cache_written("kv_cache"),
    ),
    attrs=(*_scale_attrs("stored K = new K / k_scale", "stored V = new V / v_scale"), KV_LAYOUT),
    results=("kv_cache", "value_cache"),
    result_like=(),
    returned=2,
    aliases={0: 2, 1: 5},
    doc="""Writes new K/V rows into the paged cache in place (vLLM's reshape_and_cache_flash slots).

Token n goes to page slot // page_size, row slot % page_size; a negative slot is padding (skipped).
K is stored divided by k_scale and V by v_scale, rounded to the cache dtype (an fp8 cache
saturates at +-448). A slot >= P * page_size is never written: the CUDA kernel skips it, the CPU
paths and validation raise, naming the token. With value_cache, K goes to kv_cache and V to
value_cache. The caches must be contiguous (torch: updated in place, returns None; JAX: the
results alias them, kv_cache alone returned without value_cache).""",
    sample=_kv_cache_update_sample,
    sample_attrs={"k_scale": None, "v_scale": None},
)


def _kv_cache_store_sample(zeros: bool) -> dict[str, np.ndarray]:
    """kv_cache_update's sample with its new rows split into K and V [N, Hkv, D], written into
    separate K and V caches [P, page_size, Hkv, D] (vLLM's layout; the interleaved cache is
    kv_cache_update's sample)."""
    sample = _kv_cache_update_sample(zeros)
    new_kv, cache = sample["new_kv"], sample["kv_cache"]
    split = {
        "key": new_kv[:, 0::2].copy(),
        "value": new_kv[:, 1::2].copy(),
        "kv_cache": cache[:, :, 0::2].copy(),
        "value_cache": cache[:, :, 1::2].copy(),
    }
    return {name: split.get(name, sample.get(name)) for name in KV_CACHE_STORE.operand_names}


_KV_ROWS = "[N, Hkv, D]"
KV_CACHE_STORE = Op(
    name="kv_cache_store",
    operands=(
        Operand("key", 3, _FLOATS, _KV_ROWS + ": the new tokens' K rows"),
        Operand("value", 3, "key's", _KV_ROWS + ": their V rows"),
        KV_CACHE_UPDATE.operands[1],
        Operand("kv_cache", 4, "key's or float8_e4m3fn", _KV_CACHE, other_ranks=(5,)),
        K_SCALES,
        V_SCALES,
        _value_cache_written("kv_cache"),
    ),
    attrs=KV_CACHE_UPDATE.attrs,
    results=("kv_cache", "value_cache"),
    result_like=(),
    returned=2,
    aliases={0: 3, 1: 6},
    keyword_only=True,
    doc="""kv_cache_update for K and V held apart (vLLM's reshape_and_cache_flash(key, value, ...)).

key and value go to the combined cache's even (K) and odd (V) heads at the slots, or with
value_cache to kv_cache (K) and value_cache (V), with kv_cache_update's slot, scale and fp8 rules
and no interleaved copy of the new rows. Every argument is given by keyword.""",
    sample=_kv_cache_store_sample,
    sample_attrs={"k_scale": None, "v_scale": None},
)


def _rms_norm_sample(zeros: bool) -> dict[str, np.ndarray]:
    """8 rows of 320 (a 16-byte multiple: the CUDA kernel's vector path) and a non-unit weight."""
    x, weight = np.zeros((8, 320), np.float32), np.zeros((320,), np.float32)
    if not zeros:
        rng = np.random.default_rng(0)
        x[...] = rng.standard_normal(x.shape, np.float32)
        weight[...] = rng.uniform(0.5, 1.5, weight.shape).astype(np.float32)
    return {"x": x, "weight": weight}


RMS_NORM = Op(
    name="rms_norm",
    operands=(Operand("x", -1, _FLOATS, "[..., H]"), Operand("weight", 1, "x's", "[H]")),
    attrs=(Attr("eps", float, "added to the mean of squares (>= 0)", 1e-6),),
    results=("out",),
    result_like=("x",),
    doc="out = x / sqrt(mean(x**2, last dim) + eps) * weight, in float32, rounded once to x's dtype.",
    sample=_rms_norm_sample,
    sample_attrs={"eps": 1e-6},
)


def _merge_attention_states_sample(zeros: bool) -> dict[str, np.ndarray]:
    """T 6, H 4, D 64; the LSEs hold an empty part on either side (-inf, and FA2's +inf) and a
    row whose two parts are both empty."""
    shapes = {"out_a": (6, 4, 64), "lse_a": (6, 4), "out_b": (6, 4, 64), "lse_b": (6, 4)}
    sample = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    if not zeros:
        rng = np.random.default_rng(0)
        for name, array in sample.items():
            array[...] = rng.standard_normal(array.shape, np.float32) * (3 if "lse" in name else 1)
        sample["lse_a"][1, 0] = -np.inf
        sample["lse_b"][2, 1] = np.inf
        sample["lse_a"][3, 2] = sample["lse_b"][3, 2] = -np.inf
    return sample


_LSE_DOC = "[T, H]: log-sum-exp of the part's logits (natural log); -inf or +inf: an empty part"
MERGE_ATTENTION_STATES = Op(
    name="merge_attention_states",
    operands=(
        Operand("out_a", 3, _FLOATS, "[T, H, D]: attention over one part of the keys"),
        Operand("lse_a", 2, "float32", _LSE_DOC),
        Operand("out_b", 3, "out_a's", "[T, H, D]: attention over the other part"),
        Operand("lse_b", 2, "float32", _LSE_DOC),
    ),
    attrs=(),
    results=("out", "lse"),
    result_like=("out_a", "lse_a"),
    returned=2,
    doc="""Merges two attention results over disjoint keys into the one over all of them.

With m = max(lse_a, lse_b) and w = exp(lse - m): out = (w_a out_a + w_b out_b) / (w_a + w_b) and
lse = m + log(w_a + w_b), in float32 (vLLM's merge_attn_states, LSE [T, H] as FlashInfer's). A row
whose two parts are both empty gets out 0 and lse -inf.""",
    sample=_merge_attention_states_sample,
)

OPS: tuple[Op, ...] = (
    SIMPLE_ADD,
    PAGED_ATTENTION,
    KV_CACHE_UPDATE,
    KV_CACHE_STORE,
    RMS_NORM,
    MERGE_ATTENTION_STATES,
)
BY_NAME: dict[str, Op] = {op.name: op for op in OPS}


def get(name: str | Op) -> Op:
    if isinstance(name, Op):
        return name
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"op: {name!r} is not one of {tuple(BY_NAME)}") from None
