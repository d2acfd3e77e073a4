"""`python -m bench cpu|registers|cost`: the benchmark suite's entry point."""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("suite", choices=["cpu", "registers", "cost"], help="which suite to run")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
