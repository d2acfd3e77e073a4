"""`python -m bench cpu|registers|cost|gpu|tune [--quick]|sanitize`: the benchmark suite's entry point;
`python -m bench wheelhouse ...` gathers the wheels for a GPU host without internet."""

import argparse
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["wheelhouse"]:
        from bench import wheelhouse
        return wheelhouse.run(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", epilog="python -m bench wheelhouse --help: wheels "
                                                                    "for a GPU host without internet")
    parser.add_argument("suite", choices=["cpu", "registers", "cost", "gpu", "tune", "sanitize"], help="which suite to run")
    parser.add_argument("--quick", action="store_true",
                        help="gpu, tune: fewer reps and shapes (fits a 10-minute limit)")
    parser.add_argument("--only", metavar="TEXT", help="gpu, tune: only the rows (tune: and timing logs and "
                        "sweeps) whose name holds TEXT (e.g. 'attention bwd', 'gemm'); results go to "
                        "<suite>-only-TEXT-<device>-<date>")
    parser.add_argument("--kernels", choices=["all", "rows", "backward", "cross-block", "views", "variants"],
                        default="all",
                        help="sanitize: which kernels (the timed rows' on small shapes, the attention backward's, "
                             "those whose blocks meet in a workspace, those reading views in place, or the "
                             "variants: a GEMM's persistent forms and walks, attention's producer forms)")
    args = parser.parse_args(argv)
    if args.suite == "cpu":
        from bench import cpu
        return 0 if all(f.ok is not False for f in cpu.run()) else 1
    elif args.suite == "registers":
        from bench import registers
        return 0 if registers.run() else 1
    elif args.suite == "cost":
        from bench import cost
        cost.run()
    elif args.suite == "gpu":
        from bench import gpu
        return gpu.run(quick=args.quick, only=args.only)
    elif args.suite == "sanitize":
        from bench import sanitize
        return sanitize.run(args.kernels)
    elif args.suite == "tune":
        from bench import gpu_tuning
        return gpu_tuning.run(quick=args.quick, only=args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
