"""`containerbench plan`, `launch` and `preflight`: a sweep's runs, printed or estimated; one run
launched; and the pre-flight check a compute node runs before any job (containerbench.preflight)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from containerbench import config as cb_config
from containerbench import outputs
from containerbench.frameworks import FRAMEWORKS


def cmd_plan(args) -> int:
    from containerbench import slurm
    from containerbench.cost import (
        estimate,
        first_plans,
        format_estimate,
        format_most,
        most_estimate,
        one_node_jobs,
        sweep_records,
    )
    from containerbench.launchers import uses_slurm
    from containerbench.plans import plan_sweep

    if args.records and not args.estimate:
        raise cb_config.ConfigError("plan: --records is read only with --estimate")
    config = cb_config.load(args.config)
    if args.every_runtime:
        print(every_runtime(config, Path.cwd()))
        return 0
    # What each runtime would run, from this clone; nothing is probed here.
    sweep = plan_sweep(config, Path.cwd(), probe=False)
    if args.estimate:
        if args.run_id and args.run_id not in sweep.plans:
            raise cb_config.ConfigError(f"plan: --run-id {args.run_id!r} is not a run of this sweep")
        planned = sweep.config
        if uses_slurm(planned):  # what the sweep's planning refuses, the estimate refuses too
            slurm.check_cluster(planned, sweep.runs)
        records, source = sweep_records(planned, args.records, stored_sweeps(planned))
        # With repetitions auto: the minimum counted, and what the most would cost beside it.
        plans = [sweep.plans[args.run_id]] if args.run_id else first_plans(sweep)
        cost = estimate(plans, planned, records, one_node_jobs(sweep))
        most = None if args.run_id else most_estimate(sweep, records)
        if args.json:
            print(json.dumps({**cost.as_dict(), **({"at_most": most.as_dict()} if most else {})}, sort_keys=True))
        else:
            print(format_estimate(cost, source) + (f"\n{format_most(most, planned)}" if most else ""))
        return 0
    _say_what_the_workflow_would_not_run(sweep)
    for spec in sweep.runs:
        if args.run_id and spec.run_id != args.run_id:
            continue
        run_plan = sweep.plans[spec.run_id]
        if args.json:
            print(run_plan.to_json())
        else:
            env = " ".join(f"{k}={v}" for k, v in sorted(run_plan.env.items()))
            each_node = "".join(f"\n  on each node: {shlex.join(step)}" for step in (run_plan.node_prepare,
                                                                                 run_plan.node_mpi) if step)
            print(f"{spec.run_id}{each_node}\n  env:  {env}\n  argv: {shlex.join(run_plan.argv)}")
    return 0


def _say_what_the_workflow_would_not_run(sweep) -> None:
    """The plan lists every run of the config; a runtime that cannot run from here is probed as the
    workflow would, and one line each says what the workflow will do with its runs, and why."""
    from containerbench.runtimes import unusable_here

    policy = sweep.config["runtime_policy"]
    for name, reason in unusable_here(sweep.config, sweep.artifacts).items():
        what = ("skips its runs (runtime_policy: skip-unusable)" if policy == "skip-unusable"
                else "stops before any job (runtime_policy: require)")
        print(f"containerbench: note: {name} cannot run here: {reason}; the workflow {what}", file=sys.stderr)


def cmd_launch(args) -> int:
    from containerbench.execution import run_plans
    from containerbench.plans import RunPlan

    run_plan = RunPlan.from_json(Path(args.plan[1:]).read_text() if args.plan.startswith("@") else args.plan)
    return run_plans([run_plan], [args.log], run_plan.strategy, ["launch", "--plan", args.plan, "--log", args.log],
                     salloc=run_plan.allocation, inside=args.in_allocation)



def stored_sweeps(config: dict) -> tuple[list[dict], str]:
    """The system's newest sweeps in the config's results store (history.store_path), for the estimate; a
    file there that is not a store is refused in one line."""
    from containerbench import history

    try:
        return history.newest_sweep_records(history.store_path(config), config["system"])
    except history.HistoryError as error:
        raise cb_config.ConfigError(f"config: 'history': {error}") from None


def cmd_preflight(args) -> int:
    from containerbench.preflight import run_checks

    pythons = {each.name: getattr(args, each.python_key) for each in FRAMEWORKS.values()}
    from containerbench.fabrics import DeviceRequest

    devices = [DeviceRequest(**each) for each in json.loads(args.devices)]
    layout = ({"ranks_per_node": args.ranks_per_node, "cpus_per_rank": args.cpus_per_rank,
               "gpus_per_node": args.gpus_per_node} if args.ranks_per_node else None)
    from containerbench.runtimes import NodeRequirement

    requirements = [NodeRequirement.from_json(each) for each in json.loads(args.requirements)]
    result = run_checks(args.repo, args.sources_digest, pythons, json.loads(args.probes), args.image_files,
                        devices, layout, requirements)
    for problem in result["problems"]:
        print(f"containerbench: preflight on {result['host']}: {problem}", file=sys.stderr)
    if result["problems"]:
        return 1
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        outputs.write_text(args.out, json.dumps(result, indent=2, sort_keys=True) + "\n")
    needs = f", {len(requirements)} runtime requirement(s)" if requirements else ""
    print(f"containerbench: preflight on {result['host']}: clone, bare-metal Python, "
          f"{len(result['probes'])} runtime probe(s){needs}, {len(devices)} fabric device(s) and the ranks' CPUs and "
          "GPUs ok")
    return 0



def every_runtime(config: dict, repo: Path) -> str:
    """Every runtime in each MPI model it supports, for the config's first run: its prepare commands
    and the run's argv and environment, whether or not the config's sweep names it."""
    import copy

    from containerbench import images
    from containerbench.plans import plan_sweep
    from containerbench.runtimes import CONTAINER_RUNTIMES, MPI_MODELS, RUNTIME_NAMES, BareMetal

    blocks = []
    for name in RUNTIME_NAMES:
        cls = CONTAINER_RUNTIMES.get(name)
        for model in MPI_MODELS if cls else (BareMetal.default_mpi_model,):
            one = copy.deepcopy(config)
            one["runtimes"] = [name]
            if cls:
                settings = {key: value for key, value in (one["images"].get(name) or {}).items()
                            if key not in cb_config.image_keys()}
                settings["mpi_model"] = model
                if cls.placeholder_image:  # the workflow cannot build its image
                    settings |= dict.fromkeys((cb_config.image_key("hybrid", each) for each in FRAMEWORKS),
                                              cls.placeholder_image)
                one["images"][name] = settings
            title = f"{name} ({model})"
            try:
                sweep = plan_sweep(one, repo, probe=False)
            except cb_config.ConfigError as refused:
                blocks.append(f"{title}\n  not supported: {str(refused).removeprefix('config: ')}")
                continue
            run_plan = sweep.plans[sweep.runs[0].run_id]
            build = one["images"]["build"]
            flavour = cb_config.MPI_FLAVOURS[cb_config.MODEL_FLAVOUR[model if model != "host" else "hybrid"]]
            env = cb_config.bench_env(one, sweep.runs[0].framework)
            prepared = images.runtime_commands(build["engine"], images.flavour_tag(build["tag"], env, flavour),
                                               "REGISTRY", repo / images.IMAGES,
                                               one["slurm"]["gpus_per_node"] > 0).get(name, [])
            uses_built = any((use.runtime, use.mpi_model) == (name, model) for use in sweep.artifacts)
            # A runtime whose image the site supplies still shows how it would take the built one.
            shown = prepared if uses_built or (cls and cls.placeholder_image) else []
            lines = [title, *(f"  prepare: {shlex.join(argv)}" for argv in shown)]
            if run_plan.allocation:  # a run's own salloc, with what a runtime's plugin reads there (Shifter)
                lines.append(f"  allocation: {shlex.join(run_plan.allocation)}")
            for step in (run_plan.node_prepare, run_plan.node_mpi):  # on every node, before its ranks (nodeimages,
                if step:                                               # hostmpi)
                    lines.append(f"  on each node: {shlex.join(step)}")
            env = " ".join(f"{k}={v}" for k, v in sorted(run_plan.env.items()))
            lines += [f"  env:  {env}", f"  argv: {shlex.join(run_plan.argv)}"]
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def add_commands(sub) -> None:
    p = sub.add_parser("plan", help="print every run of the sweep with its exact argv and environment")
    p.add_argument("--config", action="append", default=None,
                   help="YAML file(s), later ones override (default config/config.yaml)")
    p.add_argument("--run-id", help="only this run")
    p.add_argument("--json", action="store_true", help="one JSON plan per line (with --estimate: the estimate)")
    p.add_argument("--estimate", action="store_true",
                   help="print what the sweep costs instead: jobs, allocations, worst-case and expected node-hours")
    p.add_argument("--every-runtime", action="store_true",
                   help="instead: every runtime in each MPI model it supports, for the first run of the sweep")
    p.add_argument("--records", action="append", metavar="DIR_OR_GLOB",
                   help="run records of earlier runs the expected figure comes from "
                        "(default: <results_dir>/runs/*.json of the config)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("launch", help="run one plan, writing its raw log")
    p.add_argument("--plan", required=True, help="the plan as JSON, or @FILE")
    p.add_argument("--log", required=True)
    p.add_argument("--in-allocation", action="store_true",
                   help="run in the allocation salloc made (SLURM_JOB_ID), asking sacct why when it ends under the run")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("preflight",
                       help="check what this compute node must see before any job (the workflow's onstart)")
    p.add_argument("--repo", type=Path, required=True, help="the clone, as the workflow sees it")
    p.add_argument("--sources-digest", required=True, help="sources_digest(repo) where the workflow planned")
    for each in FRAMEWORKS.values():
        p.add_argument(each.preflight_option, help=f"{each.label}'s bare-metal interpreter, when the sweep runs "
                       f"{each.name} bare metal")
    p.add_argument("--probes", default="{}", help="JSON {runtime: probe argv} to run on this node")
    p.add_argument("--image-file", action="append", default=[], dest="image_files",
                   help="an image file the site supplies, which the node must see (repeatable)")
    p.add_argument("--devices", default="[]", help="JSON list of the devices the fabrics name (fabrics.named_devices)")
    p.add_argument("--ranks-per-node", type=int, default=0, help="the most ranks the sweep puts on one node")
    p.add_argument("--cpus-per-rank", type=int, default=1, help="slurm.cpus_per_rank")
    p.add_argument("--gpus-per-node", type=int, default=0, help="slurm.gpus_per_node (0: the ranks use no GPU)")
    p.add_argument("--requirements", default="[]",
                   help="JSON list of the runtimes' node requirements (runtimes.NodeRequirement), asked here")
    p.add_argument("--out", type=Path, help="also write the result as JSON here")
    p.set_defaults(func=cmd_preflight)
