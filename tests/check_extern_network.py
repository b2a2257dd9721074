#!/usr/bin/env python3
"""A network compiled once for a program (docs/building.md, "Compile a network once"): reads the
objects of test_extern_network's two units with nm and checks that the unit declaring the
network's passes `extern template` holds none of their code (the passes, the loops they run, the
layers' kernels), and that the unit instantiating them holds all of it, for float and double.

  check_extern_network.py --user libextern_network_user.a --instance libextern_network_instance.a

Exit 0 when both hold, 1 with a line per finding otherwise, 2 on bad arguments or no nm.
"""
import argparse
import re
import shutil
import subprocess
import sys

# The network of tests/extern_network.hpp, as nm -C spells its first layer.
NETWORK = "strata::nn::Network<strata::nn::Sequential<strata::nn::Input<6l, 6l, 2l>"
PASSES = ("forward", "backward", "init", "reserve")
# The layers' code that a pass instantiates: their implementations' members (the convolution's
# blocked GEMMs, the pooling, the dense products) and the network's per-layer steps. A layer's
# param_info() (the names and shapes Sequential::parameters() lists) is not a pass's: any unit
# that asks a model for its parameters compiles it.
KERNEL_PATTERN = re.compile(r"strata::nn::detail::\w+Impl<|::forward_one<|::backward_impl<|::forward_impl<")


def is_kernel(name):
    return KERNEL_PATTERN.search(name) is not None and ">::param_info()" not in name


def defined(path):
    out = subprocess.run(["nm", "-C", "--defined-only", path], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"check_extern_network.py: nm {path} failed: {out.stderr.strip()}")
    names = []
    for line in out.stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in ("T", "t", "W", "w"):
            names.append(parts[2])
    return names


def passes_of(names, element):
    found = set()
    for n in names:
        if n.startswith(NETWORK) and f", {element}, strata::place::Host>::" in n:
            for p in PASSES:
                if f">::{p}(" in n:
                    found.add(p)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--user", required=True, help="the library of the unit that declares the network extern")
    ap.add_argument("--instance", required=True, help="the library of the unit that instantiates it")
    a = ap.parse_args()
    if shutil.which("nm") is None:
        print("check_extern_network.py: no nm on PATH (binutils)", file=sys.stderr)
        return 2
    user, inst = defined(a.user), defined(a.instance)
    problems = []
    for element in ("float", "double"):
        missing = set(PASSES) - passes_of(inst, element)
        if missing:
            problems.append(f"{a.instance}: the instance unit does not define Network<..., {element}, Host>::"
                            + ", ".join(sorted(missing)))
        held = passes_of(user, element)
        if held:
            problems.append(f"{a.user}: the unit that declares the network extern defines Network<..., {element}, Host>::"
                            + ", ".join(sorted(held)) + " (the explicit instantiation no longer covers it: a member template, such as a pass templated on its callback, is instantiated where it is used)")
    if not any(is_kernel(n) for n in inst):
        problems.append(f"{a.instance}: no layer code in the instance unit: the pattern no longer finds the kernels")
    kernels = [n for n in user if is_kernel(n)]
    for n in kernels[:10]:
        problems.append(f"{a.user}: layer code compiled in the unit that declares the network extern: {n[:200]}")
    if len(kernels) > 10:
        problems.append(f"{a.user}: ... and {len(kernels) - 10} more")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"extern network: the user unit holds none of the passes or kernels ({len(user)} functions); "
          f"the instance unit holds them ({sum(1 for n in inst if is_kernel(n))} kernel functions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
