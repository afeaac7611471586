"""GPU accelerators for :mod:`zonos`, selected by flags; never imported by ``zonos`` at load time."""
