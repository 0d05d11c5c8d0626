"""The restriction grammar of a quick adapter: a restriction's text (Kernel Tuner's form, ``"TILE_M * TILE_N <=
2048 * num_warps"``) parsed with :mod:`ast` and evaluated by a small walker of its own, never ``eval``.

Tunable names, numbers, ``+ - * / // %``, comparisons and ``and``/``or``/``not`` only; anything else is refused
with one message naming what the text uses and what is allowed.  Standard library only.
"""

from __future__ import annotations

import ast
import inspect
import operator
from collections.abc import Mapping

from kinv.kernels.errors import BadInput
from kinv.kernels.tunables import Restriction, brief_repr

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}  # fmt: skip
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}  # fmt: skip
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_STRUCTURE = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Load,
              ast.Constant, *_BINARY, *_COMPARE, *_UNARY)  # fmt: skip
_WHAT = {ast.Call: "a call", ast.Attribute: "an attribute", ast.Subscript: "a subscript", ast.Lambda: "a lambda",
         ast.Pow: "the power operator **", ast.IfExp: "a conditional expression", ast.NamedExpr: "an assignment",
         ast.List: "a list", ast.Tuple: "a tuple", ast.Dict: "a dict", ast.Set: "a set", ast.In: "'in'",
         ast.NotIn: "'not in'", ast.Is: "'is'", ast.IsNot: "'is not'", ast.ListComp: "a comprehension",
         ast.GeneratorExp: "a generator", ast.JoinedStr: "an f-string"}  # fmt: skip


def _allowed(names) -> str:
    return (f"a restriction may use only tunable names ({', '.join(names)}), numbers, arithmetic (+ - * / // %), "
            "comparisons (== != < <= > >=) and and/or/not")  # fmt: skip


def parse_restriction(text: str, names) -> ast.Expression:
    """The parsed restriction, or BadInput saying why it is refused (one message: what it uses, what is allowed)."""
    names = tuple(names)
    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"restriction {brief_repr(text)} is refused: give a condition over the tunables, "
                         f"e.g. '{names[0] if names else 'TILE_M'} <= 128'; {_allowed(names)}")  # fmt: skip
    if len(text) > 500:
        raise BadInput(f"restriction {brief_repr(text)} is refused: it is longer than 500 characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise BadInput(f"restriction {text!r} is refused: it is not an expression ({exc.msg}); "
                         f"{_allowed(names)}") from None  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in names:
            raise BadInput(f"restriction {text!r} is refused: it names {node.id}, which is not a tunable; "
                             f"{_allowed(names)}")  # fmt: skip
        if isinstance(node, ast.Constant) and (isinstance(node.value, bool) or not isinstance(node.value, int | float)):
            raise BadInput(f"restriction {text!r} is refused: it uses the constant {node.value!r}; {_allowed(names)}")
        if not isinstance(node, _STRUCTURE):
            what = _WHAT.get(type(node), f"a {type(node).__name__} expression")
            raise BadInput(f"restriction {text!r} is refused: it uses {what}; {_allowed(names)}")
    if not isinstance(tree.body, ast.Compare | ast.BoolOp) and not (
            isinstance(tree.body, ast.UnaryOp) and isinstance(tree.body.op, ast.Not)):  # fmt: skip
        raise BadInput(f"restriction {text!r} is refused: it is not a condition (compare values, e.g. "
                         f"'{names[0] if names else 'TILE_M'} <= 128'); {_allowed(names)}")  # fmt: skip
    return tree


def _evaluate(node, values: Mapping):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, values)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left, values), _evaluate(node.right, values))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand, values))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_evaluate(v, values) for v in node.values)
        return any(_evaluate(v, values) for v in node.values)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, values)
        for op, comp in zip(node.ops, node.comparators):
            right = _evaluate(comp, values)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise TypeError(f"unexpected {type(node).__name__}")  # parse_restriction admits nothing else


def restriction(item, names) -> Restriction:
    """A kinv Restriction from a string (Kernel Tuner's form), a callable of the values dict, or ``(text, callable)``."""
    if isinstance(item, str):
        tree = parse_restriction(item, names)
        return Restriction(item.strip(), lambda v, _t=tree: bool(_evaluate(_t, v)))
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and callable(item[1]):
        fn = item[1]
        return Restriction(item[0], lambda v, _f=fn: bool(_f(dict(v))))
    if callable(item):
        doc = (inspect.getdoc(item) or "").strip().splitlines()
        name = getattr(item, "__name__", "")
        text = doc[0] if doc else (name if name and name != "<lambda>" else "a restriction given as a function")
        return Restriction(text, lambda v, _f=item: bool(_f(dict(v))))
    raise BadInput(f"restriction {brief_repr(item)} is refused: give a string such as 'TILE_M * TILE_N <= 16384', "
                     "a function of the values dict, or (text, function)")  # fmt: skip


__all__ = ["parse_restriction", "restriction"]
