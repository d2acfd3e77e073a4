"""`python -m bench cpu|registers|cost|gpu [--quick]`: the benchmark suite's entry point."""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("suite", choices=["cpu", "registers", "cost", "gpu"], help="which suite to run")
    parser.add_argument("--quick", action="store_true",
                        help="gpu: fewer reps, first schedule only, no 8192^3 GEMM (fits a 10-minute limit)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
