"""A pipeline step's ``when``: a small condition language over earlier steps, parsed, never
``eval``ed.

Grammar (keywords are lower case; whitespace between tokens is free)::

    or_expr  := and_expr ("or" and_expr)*
    and_expr := not_expr ("and" not_expr)*
    not_expr := "not" not_expr | cmp
    cmp      := operand (("==" | "!=" | "<" | "<=" | ">" | ">=") operand)?   # no chains
    operand  := NUMBER | STRING | "true" | "false" | ref | "(" or_expr ")"
    ref      := "steps" "." STEP "." ( "metrics" KEY | "state" | "params" KEY )
    KEY      := "." NAME | "[" STRING "]"

NUMBER: an integer or a decimal, with an exponent and a leading ``-`` if wanted (``3``,
``-0.5``, ``1e-3``). STRING: in ``'...'`` or ``"..."``; a backslash escapes the quote or a
backslash, nothing else. STEP: ``[A-Za-z_][A-Za-z0-9_-]*``. NAME: a metric or parameter name,
``[A-Za-z_][A-Za-z0-9_./:-]*`` not ending in ``.`` (``val/accuracy``, ``eval.loss``); any other
name is written as a string in brackets: ``steps.train.params["batch size"]``.

Values: a step's final ``metrics`` are numbers, its ``state`` a string (``"succeeded"``...), its
``params`` its hyperparameters (JSON scalars). Numbers compare with numbers (a boolean is not a
number), strings and booleans only with their own kind and only by ``==`` and ``!=``; anything
else is an ``EvalError`` naming both sides. NaN compares false, except by ``!=``. ``and`` and
``or`` stop at the first operand that decides; ``not``, ``and``, ``or`` and the condition as a
whole need booleans. ``Expr.check`` does the same type checks before anything runs, for the refs
whose kind of value is known then.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_TEXT",
    "OPERATORS",
    "And",
    "Cmp",
    "EvalError",
    "Expr",
    "ExprError",
    "Literal",
    "Not",
    "Or",
    "Ref",
    "RefNode",
    "kind_of_value",
    "parse",
]

MAX_TEXT = 1000
MAX_DEPTH = 32
OPERATORS = ("==", "!=", "<=", ">=", "<", ">")
REF_KINDS = ("metrics", "state", "params")
_KEYWORDS = ("and", "or", "not", "true", "false")

_WS_RE = re.compile(r"\s*")
_NUMBER_RE = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STEP_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_./:-]*")
_NAME_CHAR_RE = re.compile(r"[A-Za-z0-9_.]")
# Operators from other languages, and what to write instead.
_FOREIGN = {"&&": "and", "||": "or", "=": "==", "!": "not", "<>": "!="}


class ExprError(ValueError):
    """A condition that does not parse (or fails ``Expr.check``): ``position`` is the 0-based
    offset in the text; ``str()`` reads ``at column N: MESSAGE`` (N = position + 1)."""

    def __init__(self, message: str, position: int) -> None:
        self.message = message
        self.position = position
        super().__init__(f"at column {position + 1}: {message}")


class EvalError(ValueError):
    """A condition that cannot be decided: a value missing (raised by the lookup) or of the
    wrong kind (raised by ``Expr.evaluate``)."""


@dataclass(frozen=True)
class Ref:
    """``steps.STEP.metrics.KEY``, ``steps.STEP.state`` or ``steps.STEP.params.KEY``. Equal
    refs name the same value however they were written (``text``, ``position``)."""

    step: str
    kind: str  # "metrics" | "state" | "params"
    key: str | None = None  # None for "state"
    text: str = field(default="", compare=False)
    position: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return self.text or self.canonical

    @property
    def canonical(self) -> str:
        if self.key is None:
            return f"steps.{self.step}.{self.kind}"
        if _KEY_RE.fullmatch(self.key) and not self.key.endswith("."):
            return f"steps.{self.step}.{self.kind}.{self.key}"
        return f"steps.{self.step}.{self.kind}[{_quote(self.key)}]"


# The syntax tree. Each node keeps where it was written (``start``, ``end``: offsets in the text).


@dataclass(frozen=True)
class Literal:
    value: Any  # int, float, str or bool
    start: int
    end: int


@dataclass(frozen=True)
class RefNode:
    ref: Ref
    start: int
    end: int


@dataclass(frozen=True)
class Cmp:
    op: str
    left: Node
    right: Node
    start: int
    end: int
    op_position: int


@dataclass(frozen=True)
class Not:
    operand: Node
    start: int
    end: int


@dataclass(frozen=True)
class And:
    items: tuple[Node, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Or:
    items: tuple[Node, ...]
    start: int
    end: int


Node = Literal | RefNode | Cmp | Not | And | Or


def kind_of_value(value: Any) -> str | None:
    """"number", "string" or "boolean" for the values a condition compares; None for others
    (None, lists, tables)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _a(kind: str | None) -> str:
    return {"number": "a number", "string": "a string", "boolean": "a boolean"}.get(
        kind or "", "neither a number, a string nor a boolean")


@dataclass(frozen=True)
class Expr:
    """One parsed condition; ``text`` is how it was written."""

    text: str
    root: Node

    def __str__(self) -> str:
        return self.text

    def refs(self) -> tuple[Ref, ...]:
        """Every value it reads, in the order written, each once."""
        out: list[Ref] = []
        for node in _walk(self.root):
            if isinstance(node, RefNode) and node.ref not in out:
                out.append(node.ref)
        return tuple(out)

    def ref_positions(self) -> tuple[Ref, ...]:
        """Every ref as written (repeats included), each with its own ``position``."""
        return tuple(n.ref for n in _walk(self.root) if isinstance(n, RefNode))

    def compared_literals(self) -> tuple[tuple[Ref, Any, int], ...]:
        """(ref, literal value, the literal's position) for each ref compared with a literal
        directly (``steps.a.state == 'succeeded'``)."""
        out = []
        for node in _walk(self.root):
            if isinstance(node, Cmp):
                pairs = ((node.left, node.right), (node.right, node.left))
                for a, b in pairs:
                    if isinstance(a, RefNode) and isinstance(b, Literal):
                        out.append((a.ref, b.value, b.start))
        return tuple(out)

    def source(self, node: Node) -> str:
        return self.text[node.start:node.end]

    # -- before anything runs ------------------------------------------------------------

    def check(self, kind_of: Callable[[Ref], str | None]) -> None:
        """The type checks ``evaluate`` makes, done now: ``kind_of(ref)`` is the kind of value
        the ref will have ("number", "string", "boolean"), or None when not known yet. Raises
        ExprError at the first comparison or boolean that cannot work."""

        def kind(node: Node) -> str | None:
            if isinstance(node, Literal):
                return kind_of_value(node.value)
            if isinstance(node, RefNode):
                return kind_of(node.ref)
            if isinstance(node, Cmp):
                lk, rk = kind(node.left), kind(node.right)
                if lk is not None and rk is not None:
                    if lk != rk:
                        raise ExprError(
                            f"cannot compare {self._side(node.left, lk)} with "
                            f"{self._side(node.right, rk)}", node.op_position)
                    if node.op not in ("==", "!=") and lk != "number":
                        raise ExprError(f"{lk}s compare only by == and != (not {node.op})",
                                        node.op_position)
                return "boolean"
            for sub in (node.items if isinstance(node, (And, Or)) else (node.operand,)):
                k = kind(sub)
                if k is not None and k != "boolean":
                    raise ExprError(self._not_boolean(sub, k), sub.start)
            return "boolean"

        k = kind(self.root)
        if k is not None and k != "boolean":
            raise ExprError(self._not_boolean(self.root, k), self.root.start)

    def _side(self, node: Node, kind: str) -> str:
        return f"{self.source(node)} ({_a(kind)})"

    def _not_boolean(self, node: Node, kind: str) -> str:
        return (f"{self.source(node)} is {_a(kind)}, not true or false (compare it: "
                f"{self.source(node)} >= ..., == ...)")

    # -- when it runs --------------------------------------------------------------------

    def evaluate(self, lookup: Callable[[Ref], Any]) -> bool:
        """True or False; ``lookup(ref)`` gives each value read (or raises EvalError)."""
        return self._truth(self.root, lookup)

    def _truth(self, node: Node, lookup: Callable[[Ref], Any]) -> bool:
        if isinstance(node, Not):
            return not self._truth(node.operand, lookup)
        if isinstance(node, And):
            return all(self._truth(x, lookup) for x in node.items)
        if isinstance(node, Or):
            return any(self._truth(x, lookup) for x in node.items)
        value = self._value(node, lookup)
        if not isinstance(value, bool):
            raise EvalError(f"{self._describe(node, value)} is not true or false; compare it "
                            f"(such as {self.source(node)} >= ...)")
        return value

    def _value(self, node: Node, lookup: Callable[[Ref], Any]) -> Any:
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, RefNode):
            return lookup(node.ref)
        if isinstance(node, Cmp):
            return self._compare(node, lookup)
        return self._truth(node, lookup)

    def _compare(self, node: Cmp, lookup: Callable[[Ref], Any]) -> bool:
        left = self._value(node.left, lookup)
        right = self._value(node.right, lookup)
        lk, rk = kind_of_value(left), kind_of_value(right)
        if lk is None or rk is None or lk != rk:
            raise EvalError(f"cannot compare {self._describe(node.left, left)} with "
                            f"{self._describe(node.right, right)}")
        if node.op == "==":
            return bool(left == right)
        if node.op == "!=":
            return bool(left != right)
        if lk != "number":
            raise EvalError(f"cannot order {self._describe(node.left, left)} and "
                            f"{self._describe(node.right, right)}: {lk}s compare only by == and !=")
        if node.op == "<":
            return bool(left < right)
        if node.op == "<=":
            return bool(left <= right)
        if node.op == ">":
            return bool(left > right)
        return bool(left >= right)

    def _describe(self, node: Node, value: Any) -> str:
        kind = kind_of_value(value)
        what = _a(kind) if kind else f"a {type(value).__name__}, which is not compared"
        if isinstance(node, Literal):
            return f"{self.source(node)} ({what})"
        return f"{self.source(node)} ({_show(value)}, {what})"


def _walk(node: Node) -> list[Node]:
    out: list[Node] = [node]
    if isinstance(node, Cmp):
        out += _walk(node.left) + _walk(node.right)
    elif isinstance(node, Not):
        out += _walk(node.operand)
    elif isinstance(node, (And, Or)):
        for x in node.items:
            out += _walk(x)
    return out


# ---------------------------------------------------------------------------------------------
# The parser: recursive descent straight over the characters.


_VALUE = ("a value (a number, a 'string', true, false, steps.STEP.metrics.NAME, "
          "steps.STEP.state, steps.STEP.params.NAME or a '(')")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0

    # -- characters ------------------------------------------------------------------------

    def skip(self) -> int:
        m = _WS_RE.match(self.text, self.pos)
        assert m is not None
        self.pos = m.end()
        return self.pos

    def at_end(self) -> bool:
        return self.skip() >= len(self.text)

    def word_here(self) -> str | None:
        self.skip()
        m = _WORD_RE.match(self.text, self.pos)
        return m.group() if m else None

    def keyword(self, word: str) -> bool:
        """The keyword ``word`` here (as a whole word): consume it."""
        if self.word_here() == word:
            self.pos += len(word)
            return True
        return False

    def describe_here(self) -> str:
        if self.pos >= len(self.text):
            return "the end"
        m = _WORD_RE.match(self.text, self.pos) or _NUMBER_RE.match(self.text, self.pos)
        token = m.group() if m else self.text[self.pos]
        return repr(token)

    def fail(self, message: str, position: int | None = None) -> ExprError:
        return ExprError(message, self.pos if position is None else position)

    # -- grammar ---------------------------------------------------------------------------

    def parse(self) -> Node:
        if len(self.text) > MAX_TEXT:
            raise self.fail(f"a condition of at most {MAX_TEXT} characters; this one has "
                            f"{len(self.text)}", MAX_TEXT)
        if self.at_end():
            raise self.fail("expected a condition, such as steps.evaluate.metrics.accuracy >= 0.9 "
                            "(the text is empty)")
        node = self.or_expr()
        if not self.at_end():
            raise self.fail(f"expected 'and', 'or' or the end, not {self.describe_here()}"
                            + self.foreign_hint())
        return node

    def foreign_hint(self) -> str:
        for op in sorted(_FOREIGN, key=len, reverse=True):
            if self.text.startswith(op, self.pos):
                return f" (write {_FOREIGN[op]!r} for {op!r})"
        return ""

    def or_expr(self) -> Node:
        start = self.skip()
        items = [self.and_expr()]
        while self.keyword("or"):
            items.append(self.and_expr("or"))
        return items[0] if len(items) == 1 else Or(tuple(items), start, items[-1].end)

    def and_expr(self, after: str | None = None) -> Node:
        start = self.skip()
        items = [self.not_expr(after)]
        while self.keyword("and"):
            items.append(self.not_expr("and"))
        return items[0] if len(items) == 1 else And(tuple(items), start, items[-1].end)

    def nest(self, position: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"at most {MAX_DEPTH} nested parentheses or 'not's", position)

    def not_expr(self, after: str | None = None) -> Node:
        start = self.skip()
        if self.keyword("not"):
            self.nest(start)
            operand = self.not_expr("not")
            self.depth -= 1
            return Not(operand, start, operand.end)
        return self.cmp(after)

    def operator_here(self) -> str | None:
        self.skip()
        for op in OPERATORS:  # two-character ones first
            if self.text.startswith(op, self.pos):
                return op
        return None

    def cmp(self, after: str | None) -> Node:
        left = self.operand(after)
        op = self.operator_here()
        if op is None:
            if self.text.startswith("=", self.pos) or self.text.startswith("<>", self.pos):
                raise self.fail(f"expected an operator, not {self.describe_here()}" + self.foreign_hint())
            return left
        op_position = self.pos
        self.pos += len(op)
        right = self.operand(op)
        if self.operator_here() is not None:
            raise self.fail("expected 'and', 'or' or the end: comparisons do not chain (write "
                            "a < b and b < c)")
        return Cmp(op, left, right, left.start, right.end, op_position)

    def operand(self, after: str | None) -> Node:
        start = self.skip()
        text = self.text
        if start >= len(text) or text[start] == ")":
            where = f" after {after!r}" if after else ""
            raise self.fail(f"expected a value{where}" if after else f"expected {_VALUE}")
        ch = text[start]
        if ch == "(":
            self.nest(start)
            self.pos += 1
            inner = self.or_expr()
            self.skip()
            if not text.startswith(")", self.pos):
                raise self.fail(f"expected ')' to close the '(' at column {start + 1}, not "
                                f"{self.describe_here()}")
            self.pos += 1
            self.depth -= 1
            return _spanned(inner, start, self.pos)
        if ch in "'\"":
            value = self.string()
            return Literal(value, start, self.pos)
        m = _NUMBER_RE.match(text, start)
        if m:
            self.pos = m.end()
            if self.pos < len(text) and _NAME_CHAR_RE.match(text, self.pos):
                raise self.fail(f"expected a number, not {text[start:self.pos + 1]!r}...", start)
            raw = m.group()
            number: float | int = int(raw) if re.fullmatch(r"-?\d+", raw) else float(raw)
            if isinstance(number, float) and not math.isfinite(number):
                raise self.fail(f"a number that fits a float, not {raw}", start)
            return Literal(number, start, self.pos)
        word = self.word_here()
        if word == "true" or word == "false":
            self.pos += len(word)
            return Literal(word == "true", start, self.pos)
        if word == "steps":
            return self.ref()
        if word in ("and", "or", "not") and after is None:
            raise self.fail(f"expected {_VALUE} before {word!r}")
        if word is not None:
            where = f" after {after!r}" if after else ""
            hint = ""
            if word in ("True", "False"):
                hint = f" (write {word.lower()})"
            elif word not in _KEYWORDS:
                hint = " (a value of a step is steps.STEP.metrics.NAME, steps.STEP.state or " \
                       "steps.STEP.params.NAME; quote text: 'like this')"
            raise self.fail(f"expected a value{where}, not {word!r}{hint}")
        where = f" after {after!r}" if after else ""
        raise self.fail(f"expected a value{where}, not {self.describe_here()}" + self.foreign_hint())

    def string(self) -> str:
        text = self.text
        start = self.pos
        quote = text[start]
        out: list[str] = []
        i = start + 1
        while i < len(text):
            c = text[i]
            if c == "\\":
                if i + 1 < len(text) and text[i + 1] in (quote, "\\"):
                    out.append(text[i + 1])
                    i += 2
                    continue
                raise self.fail(f"a backslash escapes only {quote} or \\ in a string", i)
            if c == quote:
                self.pos = i + 1
                return "".join(out)
            out.append(c)
            i += 1
        raise self.fail(f"a string with its closing {quote}", start)

    def expect_dot(self, what: str) -> None:
        if not self.text.startswith(".", self.pos):
            raise self.fail(f"expected '.' then {what}, not {self.describe_here()}")
        self.pos += 1

    def ref(self) -> RefNode:
        start = self.pos
        text = self.text
        self.pos += len("steps")
        self.expect_dot("a step's name (steps.STEP.metrics.NAME)")
        m = _STEP_RE.match(text, self.pos)
        if m is None:
            raise self.fail(f"expected a step's name after 'steps.', not {self.describe_here()}")
        step = m.group()
        self.pos = m.end()
        self.expect_dot("metrics, state or params")
        m = _WORD_RE.match(text, self.pos)
        kind = m.group() if m else None
        if kind not in REF_KINDS:
            raise self.fail(f"expected metrics, state or params after 'steps.{step}.', not "
                            f"{self.describe_here()}")
        assert kind is not None
        self.pos += len(kind)
        key: str | None = None
        if kind != "state":
            if text.startswith("[", self.pos):
                self.pos += 1
                if self.pos >= len(text) or text[self.pos] not in "'\"":
                    raise self.fail(f"expected a quoted name in steps.{step}.{kind}[...]")
                key = self.string()
                if not key:
                    raise self.fail("expected a name that is not empty", self.pos - 2)
                if not text.startswith("]", self.pos):
                    raise self.fail(f"expected ']', not {self.describe_here()}")
                self.pos += 1
            else:
                self.expect_dot(f"a {'metric' if kind == 'metrics' else 'parameter'}'s name")
                m = _KEY_RE.match(text, self.pos)
                if m is None:
                    raise self.fail(f"expected a {'metric' if kind == 'metrics' else 'parameter'}'s "
                                    f"name after 'steps.{step}.{kind}.' (other names in brackets: "
                                    f"steps.{step}.{kind}[\"a name\"]), not {self.describe_here()}")
                key = m.group().rstrip(".")
                self.pos += len(key)
        elif _NAME_CHAR_RE.match(text, self.pos) or text.startswith("[", self.pos):
            raise self.fail(f"expected nothing after steps.{step}.state (a step's state has no "
                            "parts)")
        written = text[start:self.pos]
        return RefNode(Ref(step, kind, key, written, start), start, self.pos)


def _spanned(node: Node, start: int, end: int) -> Node:
    """``node`` as written with its parentheses (messages quote them)."""
    if isinstance(node, Literal):
        return Literal(node.value, start, end)
    if isinstance(node, RefNode):
        return RefNode(node.ref, start, end)
    if isinstance(node, Cmp):
        return Cmp(node.op, node.left, node.right, start, end, node.op_position)
    if isinstance(node, Not):
        return Not(node.operand, start, end)
    if isinstance(node, And):
        return And(node.items, start, end)
    return Or(node.items, start, end)


def parse(text: str) -> Expr:
    """Parse a condition; raises ExprError (with the position) when it does not parse."""
    if not isinstance(text, str):
        raise ExprError(f"a condition is text, not {type(text).__name__}", 0)
    return Expr(text, _Parser(text).parse())
