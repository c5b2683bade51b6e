"""Server-side message filters: RocketMQ tag expressions and SQL92 over properties.

Semantics follow Apache RocketMQ so that consumers written against RocketMQ
behave the same here:

* **TAG** -- ``*`` (or empty) matches every message; ``TagA || TagB`` matches a
  message whose tag is one of the alternatives (alternatives are trimmed,
  empty ones ignored; a ``*`` alternative makes the filter match everything).
  A message without a tag matches only ``*``. Each tag also has a stable
  :func:`tag_hash` (CRC32C, never Python's per-process randomized ``hash()``)
  that the store writes into consume-queue entries; :attr:`TagFilter.tag_hashes`
  lets it skip entries without reading the commitlog, and :meth:`matches`
  re-checks the real tag because hashes can collide.
* **SQL92** -- RocketMQ's (ActiveMQ-derived) selector language over message
  properties, with SQL three-valued logic: a comparison involving a missing
  property, or a property that cannot be converted to the literal's type
  (``a > 5`` with ``a='x'``), is *unknown*; ``NOT unknown`` is unknown and only
  a *true* result matches. The message tag is visible as the property ``TAGS``.
  Two property values compare as strings; against a numeric literal the
  property is converted to int/float, against ``TRUE``/``FALSE`` to a boolean.

SQL92 is parsed with ``lark`` (LALR) rather than regular expressions: a real
grammar gets operator precedence, ``BETWEEN x AND y`` versus logical ``AND``,
quoting and keyword/identifier collisions right, and its errors carry the
exact column. Each expression is parsed once and compiled to a tree of Python
closures; evaluating a message never re-parses (and :func:`compile_filter` is
LRU-cached, so subscriptions sharing an expression share the compiled filter).
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any, Callable, Protocol

import crc32c
from lark import Lark, Token, Transformer
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from core_broker.errors import IllegalFilterExpressionError
from core_broker.model import FilterExpression, FilterType

__all__ = ["CompiledFilter", "TagFilter", "SqlFilter", "compile_filter", "tag_hash"]

Props = dict[str, str]
# A predicate returns True, False or None (SQL "unknown").
Pred = Callable[[str | None, Props], bool | None]
Getter = Callable[[str | None, Props], Any]


def tag_hash(tag: str) -> int:
    """Stable hash of a tag (unsigned 32-bit CRC32C, fits a signed 64-bit field)."""
    return crc32c.crc32c(tag.encode("utf-8"))


class CompiledFilter(Protocol):
    tag_hashes: frozenset[int] | None  # acceptable tag hashes; None = no hash pre-filter
    matches_all: bool

    def matches(self, tag: str | None, properties: Props) -> bool: ...


class TagFilter:
    """``*`` or ``TagA || TagB``; ``tags``/``tag_hashes`` are None when matching all."""

    __slots__ = ("expression", "tags", "tag_hashes", "matches_all")

    def __init__(self, expression: str, tags: frozenset[str] | None) -> None:
        self.expression = expression
        self.tags = tags
        self.matches_all = tags is None
        self.tag_hashes = None if tags is None else frozenset(map(tag_hash, tags))

    def matches(self, tag: str | None, properties: Props | None = None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)

    def __repr__(self) -> str:
        return f"TagFilter({self.expression!r})"


class SqlFilter:
    """A compiled SQL92 expression; matches when it evaluates to TRUE."""

    __slots__ = ("expression", "_pred")
    tag_hashes = None
    matches_all = False

    def __init__(self, expression: str, pred: Pred) -> None:
        self.expression = expression
        self._pred = pred

    def matches(self, tag: str | None, properties: Props) -> bool:
        return self._pred(tag, properties) is True

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


# --------------------------------------------------------------------------- SQL92 grammar

_GRAMMAR = r"""
?start: disjunction
?disjunction: conjunction (_OR conjunction)*
?conjunction: negation (_AND negation)*
?negation: _NOT negation                              -> not_
         | predicate
?predicate: value COMPOP value                        -> compare
          | value _IS _NULL                           -> is_null
          | value _IS _NOT _NULL                      -> is_not_null
          | value _BETWEEN value _AND value           -> between
          | value _NOT _BETWEEN value _AND value      -> not_between
          | value _IN "(" literal ("," literal)* ")"       -> in_
          | value _NOT _IN "(" literal ("," literal)* ")"  -> not_in
          | value _LIKE STRING (_ESCAPE STRING)?           -> like
          | value _NOT _LIKE STRING (_ESCAPE STRING)?      -> not_like
          | "(" disjunction ")"
          | value                                     -> truth
?value: NAME                                          -> prop
      | literal
literal: STRING | NUMBER | _TRUE -> true | _FALSE -> false | _NULL -> null

_OR: "or"i
_AND: "and"i
_NOT: "not"i
_IS: "is"i
_NULL: "null"i
_BETWEEN: "between"i
_IN: "in"i
_LIKE: "like"i
_ESCAPE: "escape"i
_TRUE: "true"i
_FALSE: "false"i
COMPOP: /<>|!=|<=|>=|=|<|>/
NAME: /[A-Za-z_$][A-Za-z0-9_$.]*/
NUMBER: /[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?/
STRING: /'(?:[^']|'')*'/

%ignore /\s+/
"""

_PARSER = Lark(_GRAMMAR, parser="lalr", maybe_placeholders=False)

_NUMERIC = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "!=": operator.ne,
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


class _Const:
    """A literal operand (value folded at compile time)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _to_number(s: str) -> int | float | None:
    if not _NUMERIC.fullmatch(s):
        return None
    try:
        return int(s)
    except ValueError:
        return float(s)


def _to_bool(s: str) -> bool | None:
    low = s.strip().lower()
    return True if low == "true" else False if low == "false" else None


def _convert(value: Any, like: Any) -> Any:
    """Convert a (property) string ``value`` to the type of ``like``; None if impossible."""
    if type(like) is bool:
        return _to_bool(value)
    if type(like) in (int, float):
        return _to_number(value)
    return None


def _coerce(a: Any, b: Any) -> tuple[Any, Any] | None:
    """Bring two operands to comparable types, or None (unknown) if they cannot be."""
    if a is None or b is None:
        return None
    ta, tb = type(a), type(b)
    if ta is tb:
        return a, b
    if ta is str:
        a = _convert(a, b)
        return None if a is None else (a, b)
    if tb is str:
        b = _convert(b, a)
        return None if b is None else (a, b)
    if ta is not bool and tb is not bool:  # int vs float
        return a, b
    return None


def _getter(v: Any) -> Getter:
    if isinstance(v, _Const):
        c = v.value
        return lambda t, p: c
    return v


def _compare(op: str, left: Any, right: Any) -> Pred:
    if op in ("<", "<=", ">", ">="):
        for side in (left, right):
            if isinstance(side, _Const) and type(side.value) is bool:
                raise IllegalFilterExpressionError(f"a boolean cannot be an operand of {op!r}")
    fn = _OPS[op]
    if isinstance(right, _Const) and not isinstance(left, _Const):
        # Fast path for the usual ``property OP literal``: the literal is a closed-over value.
        c, get = right.value, left
        if c is None:
            return lambda t, p: None

        def pred(t: str | None, p: Props) -> bool | None:
            v = get(t, p)
            if type(v) is str and type(c) is str:
                return fn(v, c)
            pair = _coerce(v, c)
            return None if pair is None else fn(*pair)

        return pred
    lget, rget = _getter(left), _getter(right)

    def pred2(t: str | None, p: Props) -> bool | None:
        pair = _coerce(lget(t, p), rget(t, p))
        return None if pair is None else fn(*pair)

    return pred2


def _not(pred: Pred) -> Pred:
    def neg(t: str | None, p: Props) -> bool | None:
        r = pred(t, p)
        return None if r is None else not r

    return neg


def _all(preds: list[Pred]) -> Pred:
    def conj(t: str | None, p: Props) -> bool | None:
        unknown = False
        for f in preds:
            r = f(t, p)
            if r is False:
                return False
            if r is None:
                unknown = True
        return None if unknown else True

    return conj


def _any(preds: list[Pred]) -> Pred:
    def disj(t: str | None, p: Props) -> bool | None:
        unknown = False
        for f in preds:
            r = f(t, p)
            if r is True:
                return True
            if r is None:
                unknown = True
        return None if unknown else False

    return disj


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    if escape is not None and len(escape) != 1:
        raise IllegalFilterExpressionError(f"ESCAPE must be a single character, got {escape!r}")
    out, chars = [], iter(pattern)
    for ch in chars:
        if ch == escape:
            nxt = next(chars, None)
            if nxt is None:
                raise IllegalFilterExpressionError(f"LIKE pattern {pattern!r} ends with its escape character")
            out.append(re.escape(nxt))
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


_RESERVED = frozenset({"AND", "OR", "NOT", "IS", "NULL", "BETWEEN", "IN", "LIKE", "ESCAPE", "TRUE", "FALSE"})


class _Compiler(Transformer):
    """Turns the lark tree into closures (values: getter or _Const; predicates: Pred)."""

    # ---- values
    def prop(self, children: list[Token]) -> Getter:
        name = str(children[0])
        if name.upper() in _RESERVED:
            # the contextual lexer reads a keyword where no keyword fits as a name
            # ("AND", "region = OR"): in SQL92 a reserved word is never a property
            raise IllegalFilterExpressionError(f"{name!r} is a reserved word, not a property name")
        if name == "TAGS":
            return lambda t, p: t if t else p.get("TAGS")
        return lambda t, p: p.get(name)

    def literal(self, children: list[Token]) -> _Const:
        tok = children[0]
        if tok.type == "STRING":
            return _Const(tok[1:-1].replace("''", "'"))
        return _Const(_to_number(str(tok)))

    def true(self, _: list) -> _Const:
        return _Const(True)

    def false(self, _: list) -> _Const:
        return _Const(False)

    def null(self, _: list) -> _Const:
        return _Const(None)

    # ---- predicates
    def disjunction(self, children: list[Pred]) -> Pred:
        return _any(children)

    def conjunction(self, children: list[Pred]) -> Pred:
        return _all(children)

    def not_(self, children: list[Pred]) -> Pred:
        return _not(children[0])

    def compare(self, children: list) -> Pred:
        left, op, right = children
        return _compare(str(op), left, right)

    def is_null(self, children: list) -> Pred:
        get = _getter(children[0])
        return lambda t, p: get(t, p) is None

    def is_not_null(self, children: list) -> Pred:
        get = _getter(children[0])
        return lambda t, p: get(t, p) is not None

    def between(self, children: list) -> Pred:
        v, lo, hi = children
        return _all([_compare(">=", v, lo), _compare("<=", v, hi)])

    def not_between(self, children: list) -> Pred:
        return _not(self.between(children))

    def in_(self, children: list) -> Pred:
        v, *items = children
        for item in items:
            if type(item.value) not in (str, int, float):
                raise IllegalFilterExpressionError("IN list items must be string or number literals")
        return _any([_compare("=", v, item) for item in items])

    def not_in(self, children: list) -> Pred:
        return _not(self.in_(children))

    def like(self, children: list) -> Pred:
        v, pat, *esc = children
        unq = lambda tok: tok[1:-1].replace("''", "'")  # noqa: E731
        match = _like_regex(unq(pat), unq(esc[0]) if esc else None).fullmatch
        get = _getter(v)

        def pred(t: str | None, p: Props) -> bool | None:
            s = get(t, p)
            return None if type(s) is not str else match(s) is not None

        return pred

    def not_like(self, children: list) -> Pred:
        return _not(self.like(children))

    def truth(self, children: list) -> Pred:
        v = children[0]
        if isinstance(v, _Const):
            if v.value is not None and type(v.value) is not bool:
                raise IllegalFilterExpressionError(f"{v.value!r} is not a boolean expression")
            c = v.value
            return lambda t, p: c
        return lambda t, p: None if (s := v(t, p)) is None else _to_bool(s)


def _terminal_name(name: str) -> str:
    if name == "$END":
        return "end of expression"
    term = _PARSER.get_terminal(name)
    if term.pattern.type != "str":
        return name.lstrip("_")
    value = term.pattern.value
    return value.upper() if value.isalpha() else repr(value)


def _describe(e: UnexpectedInput, text: str) -> str:
    if isinstance(e, UnexpectedCharacters):
        if e.char == "'":
            return f"unterminated string literal starting at column {e.column}"
        return f"unexpected character {e.char!r} at column {e.column}"
    expected = sorted(map(_terminal_name, getattr(e, "expected", ())))
    hint = f"; expected one of: {', '.join(expected)}" if expected else ""
    if isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        return f"unexpected end of expression at column {len(text) + 1}{hint}"
    if isinstance(e, UnexpectedToken):
        return f"unexpected {e.token.value!r} at column {e.token.column}{hint}"
    return str(e)  # pragma: no cover


def _compile_sql(text: str) -> SqlFilter:
    if not text.strip():
        raise IllegalFilterExpressionError("empty SQL92 filter expression")
    try:
        tree = _PARSER.parse(text)
    except UnexpectedInput as e:
        raise IllegalFilterExpressionError(
            f"illegal SQL92 filter expression {text!r}: {_describe(e, text)}",
            expression=text, position=getattr(e, "column", None),
        ) from None
    try:
        pred = _Compiler().transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, IllegalFilterExpressionError):
            raise IllegalFilterExpressionError(
                f"illegal SQL92 filter expression {text!r}: {e.orig_exc}", expression=text) from None
        raise
    except RecursionError:
        raise IllegalFilterExpressionError(
            f"SQL92 filter expression is nested too deeply: {text[:80]!r}", expression=text) from None
    return SqlFilter(text, pred)


def _compile_tags(text: str) -> TagFilter:
    stripped = text.strip()
    if stripped in ("", "*"):
        return TagFilter(text, None)
    tags = frozenset(t.strip() for t in stripped.split("||") if t.strip())
    if not tags:
        raise IllegalFilterExpressionError(f"illegal tag expression {text!r}: no tag given", expression=text)
    return TagFilter(text, None if "*" in tags else tags)


@functools.lru_cache(maxsize=1024)
def compile_filter(expr: FilterExpression) -> CompiledFilter:
    """Compile (once; LRU-cached) a consumer filter expression.

    Raises :class:`IllegalFilterExpressionError` for an unknown filter type or an
    expression that does not parse; the message says what and where.
    """
    text = expr.expression if expr.expression is not None else ""
    try:
        ftype = FilterType(expr.type)
    except ValueError:
        raise IllegalFilterExpressionError(f"unknown filter type {expr.type!r}") from None
    if ftype is FilterType.SQL92:
        return _compile_sql(text)
    return _compile_tags(text)
