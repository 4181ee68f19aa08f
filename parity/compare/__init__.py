"""Compare: pure numpy/pandas over two run directories; needs neither torch nor mindspore."""
