"""TEST STAND-IN for slime (https://github.com/THUDM/slime), which is not on PyPI (the PyPI name
``slime`` is another project): only the module ``slime.ray.rollout`` our hook keys on, with the
shape tests/slime/test_slime_contract.py reads from slime's released source. Put on the job's
``PYTHONPATH`` by tests/slime only; never installed."""
