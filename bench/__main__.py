"""`python -m bench cpu|registers|cost|gpu|tune [--quick]`: the benchmark suite's entry point."""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("suite", choices=["cpu", "registers", "cost", "gpu", "tune"], help="which suite to run")
    parser.add_argument("--quick", action="store_true",
                        help="gpu, tune: fewer reps and shapes (fits a 10-minute limit)")
    args = parser.parse_args(argv)
    if args.suite == "cpu":
        from bench import cpu
        cpu.run()
    elif args.suite == "registers":
        from bench import registers
        return 0 if registers.run() else 1
    elif args.suite == "cost":
        from bench import cost
        cost.run()
    elif args.suite == "gpu":
        from bench import gpu
        return gpu.run(quick=args.quick)
    elif args.suite == "tune":
        from bench import gpu_tuning
        return gpu_tuning.run(quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
