"""`rlfarm eval`: greedy episodes of a stored policy (rlfarm.evaluation.playback)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from rlfarm.cli.common import RUN_FARM_HELP, PolicyVersion, fail, find_farm
from rlfarm.sections import bounds as B  # pure and light: the upper bounds of the options below


@click.command(name="eval")
@click.argument("run_name", metavar="[RUN]", required=False)
@click.option(
    "--logdir",
    type=click.Path(file_okay=False),
    help="Where RUN's directory is: RUN may be a run id under it, or a run directory [runs].",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A saved policy (e.g. RUN_DIR/final_policy.safetensors).",
)
@click.option("--run", "run_id", help="A run in the farm's Redis (its newest or --version version).")
@click.option(
    "--version",
    "version",
    type=PolicyVersion(),
    default="latest",
    show_default=True,
    help="Policy version of --run: a number or 'latest'.",
)
@click.option("--redis", "redis_url", help=RUN_FARM_HELP)
@click.option("--env", "env_id", help="Env id [the one the policy was trained on].")
@click.option(
    "--episodes",
    type=click.IntRange(min=1, max=B.MAX_EPISODES),
    default=10,
    show_default=True,
    help=f"Greedy episodes to play (at most {B.MAX_EPISODES:,}).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the first episode.")
@click.option(
    "--video",
    "video_dir",
    type=click.Path(file_okay=False),
    help='Record every episode to an .mp4 file in this directory (needs moviepy: pip install -e ".[video]").',
)
@click.option("--render", is_flag=True, help="Watch the episodes in a window (needs a display).")
@click.option(
    "--opponent",
    help="Turn-based games: who plays the other seat: random, lookahead (connect four) or a policy file "
    "(greedy) [random]. Games alternate first and second seat.",
)
@click.option(
    "--policy-for",
    "policy_for",
    multiple=True,
    metavar="NAME=FILE",
    help="A run of several policies: policy NAME acts with FILE's weights (e.g. another run's "
    "best_policy.NAME.safetensors). Repeatable.",
)
@click.pass_context
def eval_(
    ctx: click.Context,
    run_name: str | None,
    logdir: str | None,
    policy_file: str | None,
    run_id: str | None,
    version: int | str,
    redis_url: str | None,
    env_id: str | None,
    episodes: int,
    seed: int,
    video_dir: str | None,
    render: bool,
    opponent: str | None,
    policy_for: tuple[str, ...],
) -> None:
    """Run greedy episodes with a run's best policy, a saved policy file or a stored version; print
    mean ± std.

    `rlfarm eval RUN` plays RUN's best_policy.safetensors (else its final_policy.safetensors) from
    --logdir on the env of its config.json, like rl-baselines3-zoo's enjoy. Any algorithm: the
    network is the one the policy's metadata names (algo). --video DIR records the episodes,
    --render shows them.
    """
    from rlfarm.evaluation import playback

    if sum(map(bool, (run_name, policy_file, run_id))) != 1:
        fail("give exactly one of RUN (a run directory's best policy), --policy FILE or --run RUN (Redis)")
    if run_name and ctx.get_parameter_source("version") is not click.core.ParameterSource.DEFAULT:
        fail(
            "--version picks a version of --run RUN in Redis; RUN plays its run directory's best (else "
            "final) policy file"
        )
    if logdir and not run_name:
        fail("--logdir is where RUN's directory is; give it with RUN")
    if video_dir and render:
        fail("give --video DIR (record) or --render (watch), not both")
    if video_dir:
        try:
            import moviepy  # noqa: F401 - gymnasium's RecordVideo writes the .mp4 files with it
        except ImportError:
            fail('--video needs moviepy, which is not installed: pip install -e ".[video]"', 1)
    if (
        render
        and sys.platform.startswith("linux")
        and not any(os.environ.get(var) for var in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"))
    ):
        fail(
            "--render opens a window, but there is no display here (DISPLAY is not set); record the "
            "episodes to files instead with --video DIR",
            1,
        )
    render_mode = "rgb_array" if video_dir else "human" if render else None
    if run_id:
        redis_url = find_farm(redis_url, run_id).url
    try:
        if run_name:
            policy = playback.from_run_dir(run_name, logdir)
            click.echo(f"run {Path(policy.source).parent.name}: {Path(policy.source).name} (policy v{policy.version})")
        elif policy_file:
            policy = playback.from_file(policy_file)
        else:
            policy = playback.from_run(redis_url, run_id, version)
        if policy_for:
            swaps = []
            for entry in policy_for:
                name, sep, path = entry.partition("=")
                if not sep or not Path(path).is_file():
                    fail(f"--policy-for {entry!r} is not NAME=FILE (a policy of the run and a policy file)")
                swaps.append((name, path))
            policy = playback.with_policies(policy, swaps)
        env, env_id = playback.open_env(policy, env_id, render_mode)
        actor = playback.actor_for(policy, env, env_id)
        if opponent:
            playback.set_opponent(env, env_id, opponent)
        name = f"{policy.algo}-{env_id.split(':')[-1].replace('/', '-')}-policy{policy.meta.get('version', '')}"
        returns = playback.play(actor, env, env_id, episodes, seed, render_mode, video_dir, name, by_policy=True)
    except playback.PlaybackError as exc:
        fail(str(exc), exc.code)
    except KeyboardInterrupt:  # stop watching
        click.echo("rlfarm: interrupted", err=True)
        sys.exit(130)
    table = returns
    if table.ndim == 2:  # several policies: a column each; the first one's scores the run
        returns = table[:, 0]
    click.echo(
        f"{env_id}, policy v{policy.version}: mean return {returns.mean():.2f} ± "
        f"{returns.std():.2f} over {episodes} greedy episodes"
    )
    if table.ndim == 2:
        for j, name in enumerate(actor.spec.policies):
            click.echo(f"  policy {name}: mean return {table[:, j].mean():.2f} ± {table[:, j].std():.2f}")
    if opponent or getattr(env, "finished", None) is not None:  # a turn-based game: its record
        wins, draws, losses = (int((returns > 0).sum()), int((returns == 0).sum()), int((returns < 0).sum()))
        click.echo(f"against {opponent or 'random'}: {wins} won, {draws} drawn, {losses} lost")
    if video_dir:
        videos = sorted(Path(video_dir).glob("*.mp4"))
        where = video_dir.rstrip("/")  # `videos/` said `videos//`
        click.echo(f"recorded {plural(episodes, 'episode')} to {where}/ ({plural(len(videos), '.mp4 file')} there)")


def plural(n: int, what: str) -> str:
    """`1 episode`, `3 episodes`."""
    return f"{n} {what}{'' if n == 1 else 's'}"
