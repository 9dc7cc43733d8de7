"""What every entry point in launch/ shares: flags and config errors in one line, expected errors
without a traceback, `--print_config`, quiet library logs, the persistent compilation cache.

    from rlver_jax.cli import program
    _CONFIG = program.config_flag("config", None, "Training config file[:preset].")

    def main(argv):
        from rlver_jax.train import loop  # heavy imports after flag parsing: --help stays fast
        ...

    if __name__ == "__main__":
        program.run(main, required=["config"])

This module imports neither JAX nor the library, so `--help`, `--print_config` and a bad flag
answer in well under two seconds. `--help` (and absl's --helpshort, --helpfull, --helpxml) exits 0.
An expected error prints `PROG: error: MESSAGE` and exits with a status of EXIT_STATUSES: 2 for bad
input (a flag, an override, a config file or field, a path, an `InputError`), the error's own
`exit_status` where it has one (75, a temporary failure), else 1; Ctrl-C exits 130. Run by an
interpreter without the project's packages, a script says so in one line (exit 2). `--verbosity=1`
(absl's flag) or RLVER_TRACEBACK=1 shows every traceback and the libraries' INFO logs (docs/cli.md). Off a TPU
machine, JAX's probe of libtpu (its warnings about TPU_ACCELERATOR_TYPE and worker hostnames) is
skipped: `skip_tpu_probe`.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import logging
import os
import pathlib
import pkgutil
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from rlver_jax.train.interrupts import EXIT_RESTART, EXIT_STATUS  # standard library only

# The exit statuses of the launch/ scripts, one table (docs/cli.md has it with examples; each
# script's --help ends with the rows it can return, `run(statuses=...)`; tests/cli_exit_test.py
# holds both).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = EXIT_STATUS[signal.SIGINT]  # 130
EXIT_TERMINATED = EXIT_STATUS[signal.SIGTERM]  # 143
EXIT_STATUSES = {
    EXIT_OK: "done (or --help)",
    EXIT_FAILED: ("a run failed (the simulator, the disk, a divergence: the line says what to fix), or an "
                  "unexpected error (it prints its traceback)"),
    EXIT_BAD_INPUT: ("bad input: a flag, a config field or file, a path that does not exist, an input file's "
                     "contents, or an interpreter without the project's packages; nothing was started"),
    EXIT_RESTART: ("a temporary failure: a service stayed unreachable past its budget, or another process of "
                   "a multi-process run was lost or preempted; rerun the same command (on every host) to resume"),
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_TERMINATED: "stopped by SIGTERM (a preemption); rerun the same command to resume",
}
# What every script can return: its one-line errors, a bug's traceback, Ctrl-C. A script that also
# returns 75 or 143 names them (`run(statuses=...)`).
COMMON_STATUSES = (EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED)


def _not_installed(error: ModuleNotFoundError) -> str:
    """The one line for a launch/ script started by an interpreter that lacks the project's
    packages (a bare `python` outside the venv): which interpreter, and the one to use."""
    script = pathlib.Path(sys.argv[0]).name
    return (f"{script}: error: the package {error.name!r} is not installed for {sys.executable}; run the "
            f"script with the project's venv, .venv/bin/python launch/{script} (the README's Install makes it)")


try:
    from absl import app, flags
    from ml_collections import config_flags
except ModuleNotFoundError as _missing:
    print(_not_installed(_missing), file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)

from rlver_jax.checks import InputError  # noqa: E402 - after the packages' check
from rlver_jax.cli import flag_errors  # noqa: E402

FLAGS = flags.FLAGS
flags.disclaim_key_flags()  # flags defined here belong to the entry point calling us: its --help lists them
TRACEBACK_ENV = "RLVER_TRACEBACK"
# Loggers that print a line per HTTP request (httpx), the TPU-backend probe on CPU (jax), every
# checkpoint file and read-only manager (orbax, through absl), and the level they keep unless
# --verbosity >= 1 or --logger_levels names them.
QUIET_LOGGERS = {"jax": logging.WARNING, "httpx": logging.WARNING, "httpx2": logging.WARNING,  # openai 3 uses httpx2
                 "httpcore": logging.WARNING, "openai": logging.WARNING, "orbax": logging.WARNING,
                 "absl": logging.ERROR}
# Code of ours: an error raised here on purpose is a message to the user.
_OWN_DIRS = ("rlver_jax", "configs", "launch")
_REPO = pathlib.Path(__file__).resolve().parents[2]
_config_flag_names: list[str] = []
# absl's help flags: they print the help and exit 1 while the flags are parsed.
_HELP_FLAG = re.compile(r"--?(\?|help|helpshort|helpfull|helpxml)(=(true|t|1|yes|y))?", re.IGNORECASE)


class UserError(Exception):
    """An expected failure an entry point reports in one line (exit status 1, or `exit_status`)."""

    def __init__(self, message: str, exit_status: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_status = exit_status


T = TypeVar("T")


def checked_config(read: Callable[[], T]) -> T:
    """`read()`: a config read into its typed settings and checked, before the heavy imports; an
    expected error there (`is_expected`) is a bad config: one line, exit status 2, as a bad flag."""
    try:
        return read()
    except Exception as e:  # noqa: BLE001 - sorted into messages and bugs
        if verbose() or not is_expected(e):
            raise
        _exit(str(e), EXIT_BAD_INPUT)


def given_fields(name: str = "config") -> tuple[str, ...]:
    """The dotted fields the command line set on config flag `name` (`--config.simulator.base_url=...`
    -> "simulator.base_url")."""
    return tuple(config_flags.get_override_values(FLAGS[name]))


def preset_config(name: str = "config") -> Any:
    """The config of config flag `name`'s file and preset alone, without the command line's
    overrides (what an ablation changes is the difference)."""
    path, _, preset = config_flags.get_config_filename(FLAGS[name]).partition(":")
    spec = importlib.util.spec_from_file_location("_rlver_preset_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset) if preset else module.get_config()


def config_flag(name: str, default: str | None, help_text: str) -> flags.FlagHolder:
    """A locked config-file flag (`--NAME=file.py[:preset]`, overrides `--NAME.field=value`, a typo
    is an error); the first one also defines `--print_config`."""
    if not _config_flag_names:
        flags.DEFINE_bool("print_config", False, "Print the resolved config, every field with its "
                          "comment from the config files, and exit.")
    _config_flag_names.append(name)
    # ml_collections wants --config before its --config.* overrides, and applies the overrides
    # to a default config right here: put config-file flags first before that.
    sys.argv = config_flags_first(sys.argv, _config_flag_names)
    try:
        return config_flags.DEFINE_config_file(name, default, help_text, lock_config=True)
    except (AttributeError, KeyError) as e:  # an override of a field the default config lacks
        if verbose():
            raise
        _exit(flag_errors.unknown_field_message(e, sys.argv), EXIT_BAD_INPUT)


def run(main: Callable[[list[str]], Any], *, required: Sequence[str] = (),
        statuses: Sequence[int] = COMMON_STATUSES) -> None:
    """absl's app.run with this module's flag parsing, --print_config and error reporting; the
    script's --help ends with the rows of EXIT_STATUSES it can return (`statuses`)."""
    main_module = sys.modules["__main__"]
    rows = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_STATUSES.items() if code in statuses)
    main_module.__doc__ = (main_module.__doc__ or "").rstrip() + (
        f"\n\nAn expected error prints one line; --verbosity=1 or {TRACEBACK_ENV}=1 adds its traceback and "
        f"the libraries' INFO logs.\n\nExit status (docs/cli.md):\n{rows}\n")
    for name in required:
        flags.mark_flag_as_required(name)
    app.run(functools.partial(_main, main), flags_parser=_parse_flags)


def verbose() -> bool:
    """Tracebacks and library logs wanted: --verbosity >= 1 or RLVER_TRACEBACK set (not 0)."""
    if os.environ.get(TRACEBACK_ENV, "0") not in ("", "0"):
        return True
    if "verbosity" in FLAGS and FLAGS["verbosity"].present:
        return (FLAGS["verbosity"].value or 0) >= 1
    # Flags not parsed yet (an error while parsing them): read it from the command line.
    given = [m.group(1) for a in sys.argv if (m := re.fullmatch(r"--?(?:verbosity|v)=(-?\d+)", a))]
    return bool(given) and int(given[-1]) >= 1


def prog() -> str:
    return pathlib.Path(sys.argv[0]).name


def config_flags_first(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """argv with every config-file flag of `names` (`--config=F` or `--config F`) moved before the
    other flags, keeping their order otherwise."""
    head, rest, i = [argv[0]], [], 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        name = arg.lstrip("-").split("=", 1)[0]
        if arg.startswith("-") and name in names:
            n = 1 if "=" in arg else 2
            head += argv[i:i + n]
            i += n
        else:
            rest.append(arg)
            i += 1
    return head + rest


def _exit(message: str, code: int) -> NoReturn:
    print(f"{prog()}: error: {message}", file=sys.stderr)
    sys.exit(code)


def asked_for_help(argv: Sequence[str]) -> bool:
    """A help flag (--help, -?, --helpshort, --helpfull, --helpxml) among the flags of `argv`."""
    flags_part = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    return any(_HELP_FLAG.fullmatch(arg) for arg in flags_part)


def _parse_flags(argv: list[str]) -> list[str]:
    try:
        args = FLAGS(argv)
        for name in _config_flag_names:
            _check_loaded(name)
        return args
    except SystemExit as e:  # absl exits 1 after printing asked-for help: that is a success
        if e.code == 1 and asked_for_help(argv):
            sys.exit(0)
        raise
    except flags.Error as e:  # a bad value, an unknown flag, a config file whose get_config raised
        if verbose():
            raise
        _exit(flag_errors.override_message(e, _config_flag_names) or f"{flag_errors.flag_message(str(e))} (see --help)",
              EXIT_BAD_INPUT)
    except (AttributeError, KeyError) as e:  # an override of a field the config does not have
        if verbose():
            raise
        _exit(flag_errors.unknown_field_message(e, argv), EXIT_BAD_INPUT)
    except OSError as e:  # a config file that cannot be read
        if verbose():
            raise
        _exit(flag_errors.config_file_message(argv, e, _config_flag_names), EXIT_BAD_INPUT)


def _check_loaded(name: str) -> None:
    """ml_collections defers a config file's read error to the first use of the config: raise it now."""
    config = FLAGS[name].value
    if config is not None:
        getattr(config, "keys")  # an unreadable file's stand-in raises OSError on any attribute


def is_expected(e: BaseException) -> bool:
    """An error that is a message to the user, not a bug: one of the project's own error classes,
    a file or path problem, or a ValueError / RuntimeError / FloatingPointError raised in the
    project's code (where inputs are checked); anything else keeps its traceback."""
    if isinstance(e, UserError) or type(e).__module__.split(".")[0] in ("rlver_jax", "configs"):
        return True
    if isinstance(e, OSError):
        return True
    if isinstance(e, (ValueError, RuntimeError, FloatingPointError)):
        tb, filename = e.__traceback__, ""
        while tb is not None:
            filename, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
        try:
            parts = pathlib.Path(filename).resolve().relative_to(_REPO).parts
        except ValueError:
            return False
        return bool(parts) and parts[0] in _OWN_DIRS
    return False


class _PlainFormatter(logging.Formatter):
    """A log line as a user reads it, `train.py: MESSAGE` (`train.py: warning: MESSAGE` above INFO),
    without absl's prefix of level, date, thread and source line (those come back with --verbosity=1)."""

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno <= logging.INFO else f"{record.levelname.lower()}: "
        return f"{prog()}: {level}{record.getMessage()}"


def quiet_logs() -> None:
    """Library INFO logs off (QUIET_LOGGERS, unless --logger_levels names the logger); ours on, as
    plain lines (the engine's chatter is at DEBUG)."""
    from absl import logging as absl_logging

    named = set(FLAGS["logger_levels"].value or {}) if "logger_levels" in FLAGS else set()
    for name, level in QUIET_LOGGERS.items():
        if name not in named:
            logging.getLogger(name).setLevel(level)
    logging.getLogger("rlver_jax").setLevel(logging.INFO)
    absl_logging.get_absl_handler().setFormatter(_PlainFormatter())


def _print_configs() -> None:
    from rlver_jax.cli import config_doc

    for name in _config_flag_names:
        config = FLAGS[name].value
        if config is None:
            print(f"# --{name} not given")
            continue
        filename = config_flags.get_config_filename(FLAGS[name])
        overrides = config_flags.get_override_values(FLAGS[name])
        print(f"# --{name}={filename}" + (f" with {len(overrides)} override(s)" if overrides else ""))
        print(config_doc.describe(config, filename.split(":", 1)[0], overrides, flag=name))


def _main(main: Callable[[list[str]], Any], argv: list[str]) -> Any:
    skip_tpu_probe()
    loud = verbose()
    if not loud:
        quiet_logs()
    try:
        if _config_flag_names and FLAGS.print_config:
            _print_configs()
            return 0
        return main(argv)
    except app.UsageError as e:
        if loud:
            raise
        _exit(f"{e} (see --help)", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        if loud:
            raise
        print(f"{prog()}: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # noqa: BLE001 - sorted into messages and bugs
        if loud or not is_expected(e):
            raise
        _exit(str(e), exit_status(e))


def exit_status(e: BaseException) -> int:
    """The status an expected error exits with: its own `exit_status` (an int of EXIT_STATUSES, e.g.
    75 for a service past its outage budget), 2 for bad input (InputError, a path that does not
    exist), else 1."""
    own = getattr(e, "exit_status", None)
    if isinstance(own, int) and own in EXIT_STATUSES:
        return own
    return EXIT_BAD_INPUT if isinstance(e, (InputError, FileNotFoundError)) else EXIT_FAILED


def compilation_cache_dir(setting: str) -> str | None:
    """The persistent compilation cache directory of a config's `compilation_cache_dir`: "" = off;
    "auto" = $JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME or ~/.cache, under rlver_jax/jax.
    Off on virtual CPU devices (XLA_FLAGS' host device count above 1): XLA:CPU programs with
    collectives that come back from the cache can deadlock in their rendezvous (seen with jax
    0.10.2 on the offloaded train step: a fatal abort after 40 s), and such meshes are for tests."""
    if not setting or _virtual_cpu_devices() > 1:
        return None
    if setting != "auto":
        return setting
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return str(pathlib.Path(base) / "rlver_jax" / "jax")


def _virtual_cpu_devices() -> int:
    """The host device count XLA_FLAGS forces (1 when it forces none)."""
    found = re.findall(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else 1


def known_device_count() -> tuple[int, str] | None:
    """(the devices one process of a run will have, what says so) where that is known before JAX is
    imported: the platform is the CPU (JAX_PLATFORMS=cpu, which `skip_tpu_probe` sets off a TPU, or
    unset with neither libtpu nor another PJRT plugin installed), whose count is $JAX_NUM_CPU_DEVICES
    or XLA_FLAGS' host device count (1 without either). None on a TPU or GPU: JAX counts those."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms.strip().lower() != "cpu" and (
            platforms.strip() or importlib.util.find_spec("libtpu") is not None or _other_pjrt_plugins()):
        return None
    if re.fullmatch(r"\d+", os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()):
        return int(os.environ["JAX_NUM_CPU_DEVICES"]), "CPU devices: JAX_NUM_CPU_DEVICES"
    count = _virtual_cpu_devices()
    return count, ("CPU devices: XLA_FLAGS' --xla_force_host_platform_device_count" if count > 1 else
                   "the CPU, no accelerator found")


def check_mesh(shape: Sequence[int], distributed: Any) -> None:
    """config.mesh.shape against the devices of a one-process run, before JAX is imported, where
    `known_device_count` knows them (an InputError, exit 2, within a second); `distributed`
    (parallel.distributed.DistributedSettings) asking for several processes, or an accelerator,
    leaves the check to the run once JAX has found its devices."""
    from rlver_jax.parallel.mesh_shape import resolve_mesh_shape

    known = known_device_count()
    if known is not None and distributed.initialize_arguments() is None:
        resolve_mesh_shape(shape, *known)


def enable_compilation_cache(setting: str) -> str | None:
    """Point JAX's persistent compilation cache at `compilation_cache_dir(setting)` (every
    program, however fast it compiled); returns the directory, None when off."""
    import jax

    path = compilation_cache_dir(setting)
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


# What says a TPU may be attached: its device files (/dev/accel*: v4, v5p; /dev/vfio/N: v5e, v6e),
# a TPU chip on the PCI bus (Google's vendor id and the device ids JAX's own probe reads,
# jax._src.hardware_utils), or a TPU VM's settings in the environment.
_TPU_DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")
_TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")
_TPU_ENV = ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_ID", "JAX_FORCE_TPU_INIT")


def tpu_may_be_attached() -> bool:
    """Whether this machine may have a TPU (_TPU_DEVICE_FILES, _TPU_PCI_DEVICES, _TPU_ENV)."""
    if any(os.environ.get(name) for name in _TPU_ENV) or any(glob.glob(p) for p in _TPU_DEVICE_FILES):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if (pathlib.Path(vendor).read_text().strip() == "0x1ae0" and
                    (pathlib.Path(vendor).parent / "device").read_text().strip() in _TPU_PCI_DEVICES):
                return True
        except OSError:
            continue
    return False


def _other_pjrt_plugins() -> bool:
    """Whether a PJRT plugin other than libtpu is installed (a GPU's: jax-cuda12-plugin, ...),
    found where JAX looks for them (the `jax_plugins` namespace package, entry points of that group,
    $PJRT_NAMES_AND_LIBRARY_PATHS), without importing JAX."""
    from importlib.metadata import entry_points

    if os.environ.get("PJRT_NAMES_AND_LIBRARY_PATHS") or list(entry_points(group="jax_plugins")):
        return True
    spec = importlib.util.find_spec("jax_plugins")
    return spec is not None and any(True for _ in pkgutil.iter_modules(spec.submodule_search_locations or []))


def skip_tpu_probe() -> bool:
    """Set JAX_PLATFORMS=cpu (before JAX is imported) where JAX would otherwise probe a TPU that is
    not there: libtpu installed (the `test` and `tpu` extras, for launch/plan.py --topology), no TPU
    attached (`tpu_may_be_attached`), JAX_PLATFORMS unset and no other PJRT plugin installed, so
    the CPU is what JAX would pick anyway. JAX's probe loads libtpu, which prints warnings about
    TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES before giving up. On a TPU machine, where
    JAX_PLATFORMS is set, or beside a GPU's plugin, nothing changes; compiling for a TPU topology
    (rlver_jax.parallel.topology) loads libtpu itself and needs no TPU platform. Returns whether it
    set it."""
    if ("JAX_PLATFORMS" in os.environ or "jax" in sys.modules or importlib.util.find_spec("libtpu") is None
            or tpu_may_be_attached() or _other_pjrt_plugins()):
        return False
    os.environ["JAX_PLATFORMS"] = "cpu"
    return True
