"""The one error type users see.

Everything a user can get wrong (a model name, a board file, a bundle) raises
FluidError with a one-line message; the CLI turns it into exit code 2 without a
traceback. Internal bugs stay ordinary exceptions so they are not disguised.
"""


class FluidError(ValueError):
    """A problem with the user's input, reported as one line."""
