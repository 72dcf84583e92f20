"""What runs inside a rank, on the compute node, under the benchmark's interpreter: the harnesses (bench,
torchbench, netbench), what they use (distribution, datasets, torchmodels, torchdata, markers), the telemetry
sampler, the provenance hash, and the shim that finishes a container command at rank start (rankexec).

These modules import nothing of the package outside rank/ (tests/test_layers.py checks it): the ranks' venv
and image hold the framework, not the workflow's dependencies, and the provenance hash covers exactly what a
rank runs. The workflow's side (everything else in containerbench) may import from here, never the reverse.
"""
