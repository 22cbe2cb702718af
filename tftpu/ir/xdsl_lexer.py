"""Two fixes to xDSL 0.74's MLIR string-literal lexer, installed before tftpu parses text.

1. Its literal regex nests `+` inside `*`, so an unterminated string (a truncated file) takes
   time exponential in its length; ours has one alternative per character: linear.
2. A literal holding both an escape (`\\\\`, `\\"`) and non-ASCII text lexes as bytes, which a
   location or a string attribute then refuses; ours is a string whenever it is valid UTF-8,
   as in MLIR, so tensor names in any script round-trip.
"""

from __future__ import annotations

import re

from xdsl.utils import mlir_lexer
from xdsl.utils.exceptions import ParseError
from xdsl.utils.lexer import Span, Token

_LITERAL = re.compile(r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"')
_installed: list[bool] = []


def _lex_string_literal(self, start_pos):
    m = _LITERAL.match(self.input.content, start_pos)
    if m is None:
        raise ParseError(Span(start_pos, self.pos, self.input), "End of file reached before closing string literal.")
    self.pos = m.end()
    lit = mlir_lexer.StringLiteral(start_pos, self.pos, self.input)
    if "\\" not in lit.text:
        return Token(mlir_lexer.MLIRTokenKind.STRING_LIT, lit)
    try:
        lit.bytes_contents.decode("utf-8")
    except UnicodeDecodeError:
        return Token(mlir_lexer.MLIRTokenKind.BYTES_LIT, lit)
    return Token(mlir_lexer.MLIRTokenKind.STRING_LIT, lit)


def install() -> None:
    """Replace the lexer's string-literal method (once; idempotent)."""
    if not _installed:
        mlir_lexer.MLIRLexer._lex_string_literal = _lex_string_literal
        _installed.append(True)
