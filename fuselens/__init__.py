"""fuselens: see what torch.compile did to your program.

Importing this package is cheap and never imports torch: the language server
and the TUI import it. The compiler lives in `fuselens.compiler` and registers
`backend="fuselens"` with Dynamo through an entry point.
"""

__version__ = "0.1.0"


def load_ipython_extension(ipython):  # pragma: no cover - exercised via IPython tests
    """`%load_ext fuselens` registers the `%%fuselens` cell magic."""
    from fuselens.notebook_magic import load_ipython_extension as _load

    _load(ipython)
