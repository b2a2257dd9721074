#!/usr/bin/env python3
"""A network compiled once for a program (docs/building.md, "Compile a network once"): reads the
objects of test_extern_network's two units with nm and checks that the unit declaring the
network's passes `extern template` holds none of their code (the passes, the loops they run, the
layers' kernels), and that the unit instantiating them holds all of it, for float and double.

  check_extern_network.py --user libextern_network_user.a --instance libextern_network_instance.a

Exit 0 when both hold, 1 with a line per finding otherwise, 2 on bad arguments or no nm.
"""
import argparse
import os
import shutil
import subprocess
import sys

# The network of tests/extern_network.hpp, as nm -C spells its first layer.
NETWORK = "strata::nn::Network<strata::nn::Sequential<strata::nn::Input<6l, 6l, 2l>"
PASSES = ("forward", "backward", "init", "reserve")
# The layers' code that a pass instantiates: the members of their implementations (the
# convolution's blocked GEMMs, the pooling, the dense products), and the network's per-layer
# steps. Not counted: a layer's param_info() (the names and shapes Sequential::parameters() lists;
# any unit that asks a model for its parameters compiles it), its constructors and destructor (a
# unit that holds a network destroys it; without inlining, at -O1 under the sanitizers, they are
# functions of their own), and functions that only name the layers in their template arguments.
NETWORK_STEPS = {"forward_impl", "forward_one", "backward_impl", "init_impl", "reserve_impl", "reserve_one"}


def qualified_parts(name):
    """The components of a demangled function's qualified name, outermost first: the text before
    its parameter list, without a return type, split at the '::' outside template arguments."""
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    else:
        return []
    depth, start = 0, 0
    for i, ch in enumerate(name):  # a return type ends at the last space outside template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == " " and depth == 0:
            start = i + 1
    name = name[start:]
    parts, depth, cur, i = [], 0, "", 0
    while i < len(name):
        ch = name[i]
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if depth == 0 and name.startswith("::", i):
            parts.append(cur)
            cur, i = "", i + 2
            continue
        cur += ch
        i += 1
    parts.append(cur)
    return parts


def base(component):
    return component.split("<", 1)[0]


def is_kernel(name):
    parts = qualified_parts(name)
    if len(parts) < 2:
        return False
    owner, member = base(parts[-2]), base(parts[-1])
    if owner == "Network" and parts[:2] == ["strata", "nn"]:
        return member in NETWORK_STEPS
    if parts[:3] == ["strata", "nn", "detail"] and owner.endswith("Impl"):
        return member not in ("param_info", owner, "~" + owner)
    return False


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
    for path in (a.user, a.instance):
        if not os.path.isfile(path):
            print(f"check_extern_network.py: no file {path} (the build's libextern_network_*.a)", file=sys.stderr)
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
