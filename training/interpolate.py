"""``python -m training.interpolate``: the research scripts' name for :mod:`agrame.training.interpolate` (the one training
core, in the product since issue 60)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("agrame.training.interpolate", run_name="__main__", alter_sys=True)
