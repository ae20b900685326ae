"""The standing safety suite (issue 62: its own home, apart from ``benchmarks/``, which measures quality and speed).

- ``standing``: the seeded suite CI runs every time (fuzzing, kills, tamper, mounts, races), with counts;
- ``probes``: the hostile probes of issue 40 rerun (races of builds, copied manifests, metadata flips, bounds);
- ``hardening``: fuzzing of the CLI, input files and HTTP, byte flips of every stored file, heavy requests;
- ``fault``: writers killed with SIGKILL at random moments;
- ``corpus``: the passages they index; ``edits``: a racing writer that flips a byte of a served file.

Layered one way: ``corpus`` → ``fault``, ``hardening`` → ``standing`` → ``probes``; the package imports
``benchmarks`` (shared helpers: results, data, a server's port) and ``agrame``/``agrame_app``, and nothing imports it
but the tests.
"""
