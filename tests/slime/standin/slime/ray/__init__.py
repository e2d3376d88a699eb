"""TEST STAND-IN: see ``slime/__init__.py``."""
