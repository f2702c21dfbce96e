"""Board data (ZC706, ZCU104, user boards) as validated JSON files."""

from fluidnpu.boards.catalog import Board, builtin_boards, load_board

__all__ = ["Board", "builtin_boards", "load_board"]
