"""Fleets of NPUs and GPUs behind one endpoint: the Nexus planner.

`nexus` is the algorithm (pure Python), `profiles` prices ℓ(b) and model
switches from design bundles and GPU stage profiles, `inputs` reads the
sessions and fleet files, `report` prints a plan, `cli` is `fluidnpu plan`;
`node_loop`, `check`, `ray_fleet` run a plan (replayed, or on Ray), and
`serve_batch` is the Ray Serve `@serve.batch` baseline it is compared with.
"""
