"""AGRaME's front ends: the ``agrame`` command line (:mod:`agrame_app.cli`) and ``agrame serve``
(:mod:`agrame_app.serve`). They sit on top of the core (:mod:`agrame`: encoder, scoring, ranker,
index) and of PropCite (:mod:`propcite`), which the core never imports."""
