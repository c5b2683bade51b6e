"""Tests of core_broker.filter: RocketMQ tag expressions and SQL92 property filters."""

from __future__ import annotations

import subprocess
import sys

import crc32c
import pytest

from core_broker.errors import BadRequestError, IllegalFilterExpressionError
from core_broker.filter import SqlFilter, TagFilter, compile_filter, tag_hash
from core_broker.model import FilterExpression, FilterType


def tag(expr: str) -> TagFilter:
    return compile_filter(FilterExpression(expr, FilterType.TAG))


def sql(expr: str):
    return compile_filter(FilterExpression(expr, FilterType.SQL92))


def m(expr: str, tag_: str | None = None, **props: str) -> bool:
    return sql(expr).matches(tag_, props)


# ------------------------------------------------------------------------ tags


def test_tag_hash_is_stable_crc32c_and_64bit_safe():
    assert tag_hash("TagA") == crc32c.crc32c(b"TagA")
    assert tag_hash("TagA") != tag_hash("TagB")
    assert 0 <= tag_hash("\u00e9t\u00e9") < 2**63
    # Stable across processes (unlike hash(), which is randomized per process).
    out = subprocess.run(
        [sys.executable, "-c", "from core_broker.filter import tag_hash; print(tag_hash('TagA'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert int(out) == tag_hash("TagA")


@pytest.mark.parametrize("expr", ["*", "", "  ", " * "])
def test_match_all_tag_expressions(expr):
    f = tag(expr)
    assert f.matches_all is True
    assert f.tag_hashes is None
    assert f.matches("anything", {})
    assert f.matches(None, {})  # a message with no tag matches only '*'


def test_tag_alternatives_whitespace_tolerant():
    f = tag(" TagA||TagB ||  TagC ")
    assert not f.matches_all
    assert f.tags == frozenset({"TagA", "TagB", "TagC"})
    assert f.tag_hashes == frozenset({tag_hash("TagA"), tag_hash("TagB"), tag_hash("TagC")})
    for t in ("TagA", "TagB", "TagC"):
        assert f.matches(t, {})
    assert not f.matches("TagD", {})
    assert not f.matches("taga", {})  # tags are case-sensitive
    assert not f.matches("TagA ", {})


def test_single_tag_and_untagged_message():
    f = tag("TagA")
    assert f.matches("TagA", {})
    assert not f.matches(None, {})
    assert not f.matches("", {})


def test_empty_alternatives_ignored_and_star_alternative_matches_all():
    assert tag("TagA || || TagB").tags == frozenset({"TagA", "TagB"})
    assert tag("TagA || *").matches_all


def test_tag_matches_rechecks_real_tag_not_hash():
    f = tag("TagA")
    # Even if the store's hash pre-filter let an entry through (a collision), matches() checks the tag.
    assert tag_hash("TagA") in f.tag_hashes
    assert not f.matches("TagB", {})


@pytest.mark.parametrize("expr", ["||", " || || "])
def test_tag_expression_without_tags_is_illegal(expr):
    with pytest.raises(IllegalFilterExpressionError):
        tag(expr)


def test_default_filter_expression_matches_all():
    f = compile_filter(FilterExpression())
    assert f.matches_all and f.matches(None, {})


def test_compile_is_cached():
    assert tag("TagA || TagB") is tag("TagA || TagB")
    assert sql("a > 1") is sql("a > 1")
    assert sql("a > 1") is not sql("a > 2")


# ------------------------------------------------------------------------ SQL92 comparisons


def test_sql_filter_shape():
    f = sql("a = 1")
    assert isinstance(f, SqlFilter)
    assert f.tag_hashes is None
    assert f.matches_all is False


@pytest.mark.parametrize(
    "expr,value,expected",
    [
        ("a = 10", "10", True), ("a = 10", "11", False), ("a = 10", "10.0", True),
        ("a <> 10", "11", True), ("a <> 10", "10", False),
        ("a != 10", "11", True), ("a != 10", "10", False),
        ("a < 10", "9", True), ("a < 10", "10", False),
        ("a <= 10", "10", True), ("a <= 10", "11", False),
        ("a > 10", "11", True), ("a > 10", "10", False),
        ("a >= 10", "10", True), ("a >= 10", "9", False),
        # numeric, not lexicographic, comparison against number literals
        ("a > 9", "10", True), ("a < 100", "20", True),
        ("a > 1.5", "2", True), ("a > 1.5", "1.25", False), ("a = 0.5", ".5", True),
        ("a >= -3", "-3", True), ("a < -3", "-2", False), ("a = +3", "3", True),
        ("a > 1e3", "1001", True), ("a = 12345678901234567890", "12345678901234567890", True),
    ],
)
def test_numeric_comparisons(expr, value, expected):
    assert m(expr, a=value) is expected


@pytest.mark.parametrize(
    "expr,value,expected",
    [
        ("a = 'abc'", "abc", True), ("a = 'abc'", "ABC", False),
        ("a <> 'abc'", "abd", True), ("a != 'abc'", "abc", False),
        ("a < 'b'", "a", True), ("a > 'b'", "c", True), ("a >= 'b'", "b", True), ("a <= 'b'", "c", False),
        ("a = '10'", "10.0", False),  # string literal => string comparison
        ("a = 'it''s'", "it's", True),  # '' escapes a quote
        ("a = ''", "", True),
        ("a = 'x y  z'", "x y  z", True),
    ],
)
def test_string_comparisons(expr, value, expected):
    assert m(expr, a=value) is expected


def test_property_to_property_compares_as_strings():
    assert m("a = b", a="x", b="x")
    assert not m("a = b", a="x", b="y")
    assert m("a < b", a="10", b="9")  # both strings: lexicographic
    assert not m("a = b", a="x")


def test_literal_on_left_side():
    assert m("10 < a", a="11")
    assert not m("10 < a", a="9")
    assert m("'abc' = a", a="abc")


def test_unconvertible_property_against_number_is_unknown():
    for expr in ("a > 5", "a = 5", "a <> 5", "NOT (a > 5)", "NOT (a = 5)"):
        assert not m(expr, a="abc"), expr
        assert not m(expr, a="nan"), expr
        assert not m(expr, a="1_000"), expr


def test_boolean_literals():
    assert m("TRUE")
    assert not m("FALSE")
    assert m("NOT FALSE")
    assert m("flag = TRUE", flag="true")
    assert m("flag = true", flag="TRUE")
    assert m("flag = FALSE", flag="false")
    assert not m("flag = TRUE", flag="false")
    assert not m("flag = TRUE", flag="yes")
    assert not m("NOT (flag = TRUE)", flag="yes")  # unconvertible => unknown
    assert m("flag", flag="true")  # a bare property is a boolean predicate
    assert not m("flag", flag="false")
    assert m("NOT flag", flag="false")
    assert not m("NOT flag", flag="maybe")


# ------------------------------------------------------------------------ logic & three-valued


def test_and_or_not_and_precedence():
    assert m("a = 1 AND b = 2", a="1", b="2")
    assert not m("a = 1 AND b = 2", a="1", b="3")
    assert m("a = 1 OR b = 2", a="0", b="2")
    assert not m("a = 1 OR b = 2", a="0", b="0")
    # AND binds tighter than OR
    assert m("a = 1 OR a = 2 AND b = 3", a="1", b="0")
    assert not m("(a = 1 OR a = 2) AND b = 3", a="1", b="0")
    assert m("NOT a = 1 AND b = 2", a="0", b="2")  # NOT binds tighter than AND
    assert m("NOT NOT a = 1", a="1")
    assert m("((a = 1))", a="1")


def test_three_valued_logic_with_missing_property():
    assert not m("a > 1")
    assert not m("NOT (a > 1)")  # NOT unknown is unknown
    assert not m("a = 'x'")
    assert not m("a <> 'x'")
    assert not m("NOT (a = 'x')")
    # unknown AND false = false, NOT false = true
    assert m("NOT (a > 1 AND b = 1)", b="2")
    # unknown AND true = unknown -> NOT unknown -> unknown
    assert not m("NOT (a > 1 AND b = 1)", b="1")
    # unknown OR true = true, unknown OR false = unknown
    assert m("a > 1 OR b = 1", b="1")
    assert not m("a > 1 OR b = 1", b="2")
    assert not m("NOT (a > 1 OR b = 1)", b="2")


def test_null_literal_comparisons_are_unknown():
    assert not m("a = NULL", a="x")
    assert not m("NOT (a = NULL)", a="x")
    assert not m("a <> NULL", a="x")


def test_is_null_and_is_not_null():
    assert m("a IS NULL")
    assert not m("a IS NULL", a="1")
    assert m("a IS NOT NULL", a="")
    assert not m("a IS NOT NULL")
    assert m("NOT (a IS NULL)", a="1")  # IS NULL is never unknown
    assert m("a IS NULL OR a > 5")


# ------------------------------------------------------------------------ BETWEEN / IN / LIKE


def test_between():
    assert m("a BETWEEN 1 AND 3", a="1")
    assert m("a BETWEEN 1 AND 3", a="2.5")
    assert m("a BETWEEN 1 AND 3", a="3")
    assert not m("a BETWEEN 1 AND 3", a="3.01")
    assert not m("a BETWEEN 1 AND 3", a="0")
    assert not m("a BETWEEN 1 AND 3")
    assert not m("a BETWEEN 1 AND 3", a="x")
    assert m("a BETWEEN 'b' AND 'd'", a="c")
    # BETWEEN's AND does not swallow the logical AND
    assert m("a BETWEEN 1 AND 3 AND b = 'y'", a="2", b="y")
    assert not m("a BETWEEN 1 AND 3 AND b = 'y'", a="2", b="n")


def test_not_between():
    assert m("a NOT BETWEEN 1 AND 3", a="4")
    assert m("a NOT BETWEEN 1 AND 3", a="0")
    assert not m("a NOT BETWEEN 1 AND 3", a="2")
    assert not m("a NOT BETWEEN 1 AND 3")  # unknown
    assert not m("a NOT BETWEEN 1 AND 3", a="x")


def test_in_and_not_in():
    assert m("a IN ('x', 'y')", a="y")
    assert not m("a IN ('x', 'y')", a="z")
    assert not m("a IN ('x', 'y')")
    assert m("a IN ('only')", a="only")
    assert m("a IN (1, 2, 3)", a="2.0")
    assert m("a NOT IN ('x', 'y')", a="z")
    assert not m("a NOT IN ('x', 'y')", a="x")
    assert not m("a NOT IN ('x', 'y')")  # missing => unknown, not "not in"
    assert m("TAGS IN ('TagA', 'TagB')", "TagB")


@pytest.mark.parametrize(
    "pattern,value,expected",
    [
        ("'abc%'", "abcdef", True), ("'abc%'", "abc", True), ("'abc%'", "xabc", False),
        ("'%abc'", "xxabc", True), ("'%abc'", "abcx", False),
        ("'%b%'", "abc", True), ("'%b%'", "ac", False),
        ("'a_c'", "abc", True), ("'a_c'", "ac", False), ("'a_c'", "abbc", False),
        ("'a.c'", "abc", False), ("'a.c'", "a.c", True),  # regex metachars are literal
        ("'a*'", "aaa", False), ("'(x)'", "(x)", True),
        ("'%'", "", True), ("'_'", "", False),
        ("'a%'", "a\nb", True),  # % spans newlines
        ("'abc'", "ABC", False),  # case-sensitive
    ],
)
def test_like_wildcards(pattern, value, expected):
    assert m(f"a LIKE {pattern}", a=value) is expected
    assert m(f"a NOT LIKE {pattern}", a=value) is (not expected)


def test_like_escape_and_missing_property():
    assert m("a LIKE '10!%' ESCAPE '!'", a="10%")
    assert not m("a LIKE '10!%' ESCAPE '!'", a="100")
    assert m("a LIKE 'x!_y' ESCAPE '!'", a="x_y")
    assert not m("a LIKE 'x!_y' ESCAPE '!'", a="xzy")
    assert not m("a LIKE 'x%'")
    assert not m("a NOT LIKE 'x%'")


def test_tags_pseudo_property():
    assert m("TAGS = 'TagA'", "TagA")
    assert not m("TAGS = 'TagA'", "TagB")
    assert m("TAGS IS NULL", None)
    assert m("TAGS LIKE 'Tag%' AND region = 'eu'", "TagZ", region="eu")


def test_keywords_case_insensitive_identifiers_case_sensitive():
    assert m("a between 1 and 3 and b in ('x') or c is not null", a="2", b="x")
    assert m("a BeTwEeN 1 AnD 3 aNd NoT (b Is NuLl) AND b LiKe 'x%'", a="2", b="xy")
    assert m("a = True", a="true")
    assert not m("A = 1", a="1")  # property names are case-sensitive
    # identifiers that merely start with a keyword are identifiers
    assert m("ANDROID = 1 AND notes = 'n' AND isa IS NOT NULL AND index IN ('i')",
             ANDROID="1", notes="n", isa="", index="i")


def test_identifier_characters_and_whitespace():
    assert m("a.b_c$1 = 'v'", **{"a.b_c$1": "v"})
    assert m("\n\ta\t>=\n5  ", a="5")
    assert m("a>5 AND b<3", a="6", b="2")


def test_evaluation_does_not_reparse(monkeypatch):
    import core_broker.filter as mod

    f = sql("a > 1 AND b LIKE 'x%'")

    def boom(*a, **k):
        raise AssertionError("re-parsed")

    monkeypatch.setattr(mod._PARSER, "parse", boom)
    assert f.matches(None, {"a": "2", "b": "xy"})
    assert not f.matches(None, {"a": "0", "b": "xy"})


# ------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "expr,fragment",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("a == 5", "column 4"),
        ("a = 'abc", "unterminated string"),
        ("a = 'abc", "column 5"),
        ("a @ 5", "unexpected character '@'"),
        ("a >", "end of expression"),
        ("a > 1)", "unexpected ')' at column 6"),
        ("(a > 1", "end of expression"),
        ("a IN ()", "unexpected ')'"),
        ("a IN 'x'", "unexpected"),
        ("a IS NOT", "expected one of: NULL"),
        ("a NOT 5", "BETWEEN"),
        ("a BETWEEN 1", "end of expression"),
        ("a LIKE b", "unexpected 'b'"),
        ("AND a = 1", "unexpected"),
        ("a = 1 b = 2", "column 7"),
        ("5", "not a boolean"),
        ("'x'", "not a boolean"),
        ("a > TRUE", "boolean"),
        ("a IN (NULL)", "IN list"),
        ("a IN (TRUE)", "IN list"),
        ("a LIKE 'x' ESCAPE '!!'", "single character"),
        ("a LIKE 'x!' ESCAPE '!'", "escape"),
    ],
)
def test_bad_sql_expressions_raise(expr, fragment):
    with pytest.raises(IllegalFilterExpressionError) as ei:
        sql(expr)
    assert fragment in str(ei.value)
    assert ei.value.code == "ILLEGAL_FILTER_EXPRESSION"
    assert isinstance(ei.value, BadRequestError)


def test_syntax_error_reports_position_detail():
    with pytest.raises(IllegalFilterExpressionError) as ei:
        sql("a == 5")
    assert ei.value.details["position"] == 4
    assert ei.value.details["expression"] == "a == 5"


def test_nesting_depth():
    depth = 5000
    # Redundant parentheses collapse in the parse tree: any depth works.
    assert sql("(" * depth + "a = 1" + ")" * depth).matches(None, {"a": "1"})
    assert sql("NOT " * 10 + "a = 1").matches(None, {"a": "1"})
    # A pathologically deep tree is a clean error, not a RecursionError.
    with pytest.raises(IllegalFilterExpressionError, match="nested too deeply"):
        sql("NOT " * depth + "a = 1")


def test_unknown_filter_type_rejected():
    with pytest.raises(IllegalFilterExpressionError):
        compile_filter(FilterExpression("a = 1", "XPATH"))  # type: ignore[arg-type]
