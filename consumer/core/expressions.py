"""User aggregate expressions: Polars syntax from the configuration, never run as Python.

``aggregation.expressions`` maps an output column to an expression written as in Polars,
e.g. ``pl.col('latency').quantile(0.99)`` or
``(pl.col('status') >= 500).mean()``. The text is parsed with ``ast`` and *interpreted*:
each node must be one of the allowed forms below, and the Polars expression is built
from them. Nothing is ever passed to ``eval``, no name is looked up, no attribute is read
from a Python object, so a configuration cannot run code: a call, an attribute, a name
or a syntax outside the allow-list is refused with one line naming it.

Allowed: ``pl.col('name')``, ``pl.lit(constant)``, ``pl.len()``; the methods of
``_METHODS`` with constant arguments (``filter`` takes an expression); the operators
``+ - * / // % **``, comparisons, ``& | ~`` and unary minus; number, string, boolean and
``None`` constants. The whole must reduce each group's rows to one value (it must end in
an aggregation such as ``.mean()``), since it is evaluated per (window, keys).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

from wire.errors import UsageError

MAX_EXPRESSION_CHARS = 1_000
_MAX_DEPTH = 40

# How an expression's value is shaped within a group: one value per row, one per group
# (an aggregation), or a constant that broadcasts to either.
_Shape = Literal["rows", "group", "constant"]
_Constant = int | float | str | bool | None


class ExpressionError(UsageError):
    """An expression outside the allowed language; ``str()`` is one line."""


@dataclass(frozen=True)
class _Param:
    name: str
    check: Callable[[object], bool]
    wants: str  # what the check wants, for the error message
    required: bool = False


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_fraction(value: object) -> bool:
    return _is_number(value) and 0 <= value <= 1  # type: ignore[operator]


def _is_small_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 20


def _is_constant(value: object) -> bool:
    return value is None or isinstance(value, int | float | str | bool)


_INTERPOLATIONS = ("nearest", "higher", "lower", "midpoint", "linear")


@dataclass(frozen=True)
class _Method:
    aggregates: bool  # rows -> one value per group; otherwise elementwise
    params: tuple[_Param, ...] = ()


def _aggregation(*params: _Param) -> _Method:
    return _Method(aggregates=True, params=params)


def _elementwise(*params: _Param) -> _Method:
    return _Method(aggregates=False, params=params)


def _is_positive(value: object) -> bool:
    return _is_number(value) and value > 0  # type: ignore[operator]


_DDOF = _Param("ddof", _is_small_int, "an integer from 0 to 20")
_CONSTANT = _Param("value", _is_constant, "a constant", required=True)
_METHODS: dict[str, _Method] = {
    # aggregations: a group's rows become one value
    **{name: _aggregation() for name in (
        "sum", "mean", "median", "min", "max", "count", "n_unique", "first", "last",
        "null_count", "len", "product")},
    "quantile": _aggregation(
        _Param("quantile", _is_fraction, "a number from 0 to 1", required=True),
        _Param("interpolation", lambda v: v in _INTERPOLATIONS,
               f"one of {', '.join(_INTERPOLATIONS)}")),
    "std": _aggregation(_DDOF),
    "var": _aggregation(_DDOF),
    # elementwise: one value per row (or per group, after an aggregation)
    **{name: _elementwise() for name in (
        "abs", "sqrt", "exp", "is_null", "is_not_null", "is_nan", "is_not_nan", "not_",
        "floor", "ceil", "sign")},
    "log": _elementwise(_Param("base", _is_positive, "a positive number")),
    "round": _elementwise(_Param("decimals", _is_small_int, "an integer from 0 to 20")),
    "fill_null": _elementwise(_CONSTANT),
    "fill_nan": _elementwise(_CONSTANT),
    "clip": _elementwise(_Param("lower_bound", _is_constant, "a constant"),
                         _Param("upper_bound", _is_constant, "a constant")),
}

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}


@dataclass(frozen=True)
class ParsedExpression:
    """A checked expression: its text, the input columns it reads, and a builder."""

    text: str
    columns: tuple[str, ...]
    _tree: ast.expr = field(compare=False, repr=False)

    @property
    def methods(self) -> frozenset[str]:
        """The methods it calls (``n_unique``, ``filter``, ...)."""
        return frozenset(node.func.attr for node in ast.walk(self._tree)
                         if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute))

    @property
    def caveat(self) -> str:
        """What it does that the configured aggregate of the same name does not, as
        ``; ...`` for ``explain`` (empty when nothing)."""
        if "n_unique" not in self.methods:
            return ""
        return ("; .n_unique() counts a null as one more value, as Polars does, where "
                "aggregation.columns' n_unique counts non-null values only (as SQL's COUNT "
                "DISTINCT): .filter(pl.col(c).is_not_null()) first to count as it does")

    def build(self) -> pl.Expr:
        """The Polars expression (a fresh one each call)."""
        expr, _shape, _columns = _Builder().node(self._tree, 0)
        return _as_expr(expr)


def parse_expression(text: str) -> ParsedExpression:
    """Check ``text`` against the allowed language; raise ExpressionError naming the first
    thing outside it."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("an expression must be non-empty text")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"an expression may have at most {MAX_EXPRESSION_CHARS} "
                              f"characters, this one has {len(text)}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ExpressionError(f"not a valid expression ({_first_line(err)})") from None
    _expr, shape, columns = _Builder().node(tree, 0)
    if shape == "rows":
        raise ExpressionError("it gives one value per row, not per group: end it with an "
                              "aggregation such as .mean(), .quantile(0.99) or .n_unique()")
    if not columns:
        raise ExpressionError("it reads no column: use pl.col('name') (row_count already "
                              "counts each group's rows)")
    return ParsedExpression(text, tuple(dict.fromkeys(columns)), tree)


class _Builder:
    """Interprets an allowed AST node into (value, shape, columns read)."""

    def node(self, node: ast.expr, depth: int) -> tuple[Any, _Shape, list[str]]:
        if depth > _MAX_DEPTH:
            raise ExpressionError(f"nested deeper than {_MAX_DEPTH} levels")
        match node:
            case ast.Constant(value=value) if _is_constant(value):
                return value, "constant", []
            case ast.Call():
                return self._call(node, depth)
            case ast.BinOp(op=op) if type(op) in _BINARY:
                return self._combine(_BINARY[type(op)], [node.left, node.right], depth)
            case ast.Compare(ops=[op], comparators=[right]) if type(op) in _COMPARE:
                return self._combine(_COMPARE[type(op)], [node.left, right], depth)
            case ast.UnaryOp(op=ast.USub() | ast.UAdd() | ast.Invert() as op):
                value, shape, columns = self.node(node.operand, depth + 1)
                if isinstance(op, ast.Invert):
                    return _as_expr(value).not_(), shape, columns
                return (-value if isinstance(op, ast.USub) else value), shape, columns
        raise ExpressionError(f"{_describe(node)} is not allowed (allowed: pl.col, pl.lit, "
                              "pl.len, aggregation and arithmetic methods, operators, "
                              "constants)")

    def _combine(self, apply: Callable[[Any, Any], Any], operands: Sequence[ast.expr],
                 depth: int) -> tuple[Any, _Shape, list[str]]:
        (left, lshape, lcols), (right, rshape, rcols) = (self.node(o, depth + 1)
                                                         for o in operands)
        shapes = {lshape, rshape} - {"constant"}
        if shapes == {"rows", "group"}:
            raise ExpressionError("it mixes per-row values with per-group ones: aggregate "
                                  "both sides (e.g. pl.col('a').sum() / pl.col('b').sum())")
        shape: _Shape = shapes.pop() if shapes else "constant"
        if shape == "constant":
            raise ExpressionError("an operation on constants only: write its value")
        return apply(_as_expr(left), _as_expr(right)), shape, lcols + rcols

    def _call(self, node: ast.Call, depth: int) -> tuple[Any, _Shape, list[str]]:
        func = node.func
        if not isinstance(func, ast.Attribute):
            raise ExpressionError(f"calling {_describe(func)} is not allowed; start from "
                                  "pl.col('name')")
        if isinstance(func.value, ast.Name):
            if func.value.id != "pl":
                raise ExpressionError(f"the name {func.value.id!r} is not allowed; only pl")
            return self._pl_function(func.attr, node)
        method = _METHODS.get(func.attr)
        if method is None and func.attr != "filter":
            raise ExpressionError(f"the method {func.attr!r} is not allowed (allowed: "
                                  f"{', '.join(sorted([*_METHODS, 'filter']))})")
        receiver, shape, columns = self.node(func.value, depth + 1)
        if shape == "constant":
            raise ExpressionError(f".{func.attr}() of a constant: apply it to pl.col(...)")
        if method is None:
            return self._filter(receiver, shape, columns, node, depth)
        if method.aggregates and shape == "group":
            raise ExpressionError(f".{func.attr}() of an aggregate: it aggregates twice")
        kwargs = _arguments(func.attr, method.params, node)
        result = getattr(_as_expr(receiver), func.attr)(**kwargs)
        return result, ("group" if method.aggregates else shape), columns

    def _filter(self, receiver: Any, shape: _Shape, columns: list[str], node: ast.Call,
                depth: int) -> tuple[Any, _Shape, list[str]]:
        """``filter`` is the one method whose argument is an expression (a condition)."""
        if shape != "rows" or len(node.args) != 1 or node.keywords:
            raise ExpressionError(".filter() takes one per-row condition, on per-row values")
        condition, cshape, ccols = self.node(node.args[0], depth + 1)
        if cshape != "rows":
            raise ExpressionError(".filter() needs a per-row condition, e.g. pl.col('x') > 0")
        return _as_expr(receiver).filter(condition), "rows", columns + ccols

    def _pl_function(self, name: str, node: ast.Call) -> tuple[Any, _Shape, list[str]]:
        args = _constants(name, node)
        if name == "col":
            if len(args) != 1 or not isinstance(args[0], str) or not args[0]:
                raise ExpressionError("pl.col takes one column name, e.g. pl.col('latency')")
            return pl.col(args[0]), "rows", [args[0]]
        if name == "lit":
            if len(args) != 1:
                raise ExpressionError("pl.lit takes one constant")
            return pl.lit(args[0]), "constant", []
        if name == "len" and not args:
            return pl.len(), "group", []
        raise ExpressionError(f"pl.{name} is not allowed (allowed: pl.col, pl.lit, pl.len)")


def _arguments(method: str, params: Sequence[_Param], node: ast.Call) -> dict[str, object]:
    if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords):
        raise ExpressionError(f".{method}(): * and ** arguments are not allowed")
    if len(node.args) > len(params):
        raise ExpressionError(f".{method}() takes at most {len(params)} argument(s)")
    given: dict[str, object] = {}
    for param, arg in zip(params, node.args, strict=False):
        given[param.name] = _constant(method, arg)
    by_name = {p.name: p for p in params}
    for keyword in node.keywords:
        if keyword.arg not in by_name:
            raise ExpressionError(f".{method}() has no argument {keyword.arg!r}")
        if keyword.arg in given:
            raise ExpressionError(f".{method}() got {keyword.arg!r} twice")
        given[keyword.arg] = _constant(method, keyword.value)
    for param in params:
        if param.name not in given:
            if param.required:
                raise ExpressionError(f".{method}() needs {param.name} ({param.wants})")
            continue
        if not param.check(given[param.name]):
            raise ExpressionError(f".{method}(): {param.name} must be {param.wants}, "
                                  f"not {given[param.name]!r}")
    return given


def _constants(name: str, node: ast.Call) -> list[_Constant]:
    if node.keywords:
        raise ExpressionError(f"pl.{name}() takes no keyword arguments")
    return [_constant(f"pl.{name}", arg) for arg in node.args]


def _constant(where: str, node: ast.expr) -> _Constant:
    negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    inner = node.operand if isinstance(node, ast.UnaryOp) and negative else node
    if isinstance(inner, ast.Constant):
        value = inner.value
        if negative and isinstance(value, int | float) and not isinstance(value, bool):
            return -value
        if not negative and (value is None or isinstance(value, int | float | str | bool)):
            return value
    raise ExpressionError(f"{where}: arguments must be constants, not {_describe(node)}")


def _as_expr(value: Any) -> pl.Expr:
    return value if isinstance(value, pl.Expr) else pl.lit(value)


def _describe(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except (ValueError, RecursionError):  # an AST unparse cannot render
        text = type(node).__name__
    return f"`{text[:60]}`"


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]
