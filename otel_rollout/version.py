"""The package version, in a module of its own so every layer can read it without import cycles."""

__version__ = "0.1.0.dev0"
