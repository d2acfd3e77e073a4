"""`python -m bench cpu`: the benchmark suite's entry point."""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("suite", choices=["cpu"], help="which suite to run")
    args = parser.parse_args(argv)
    if args.suite == "cpu":
        from bench import cpu
        cpu.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
