#!/usr/bin/env bash
# The Docker image's Rust build, without Docker (CI has no daemon): the Dockerfile's own steps on
# the same inputs, read from the Dockerfile so that they cannot drift from it.
#   1. cargo-chef at the version of its `ARG CARGO_CHEF_VERSION=` line (installed under
#      target/image/tools when missing);
#   2. the planner stage: the build context (`COPY . .`: the repository's files less
#      .dockerignore) in a fresh directory, then the Dockerfile's `cargo chef prepare` line;
#   3. the build stage: a second fresh directory holding only recipe.json, the Dockerfile's
#      `cargo chef cook` line, then the context copied over it and the Dockerfile's build
#      command (the `RUN` line after `# image-build-command:`), verbatim.
# Then it checks that the recipe lists every bin, example, bench and test target of Cargo.toml
# (stubs written by hand once forgot the benches, and the image could not build), and that every
# binary the runtime stage copies from the build stage was built by that last step.
# The artifacts stay in target/image/cargo, so that a rerun is incremental.
#
# With CI set, the release profile is built unoptimised (CARGO_PROFILE_RELEASE_OPT_LEVEL=0 and
# CARGO_PROFILE_RELEASE_DEBUG=0 in the environment, unless already set): CI proves the image's
# steps (the recipe, the cook, the build command, verbatim), that the recipe covers every target,
# and that the build produces every artifact the image copies, with the release profile's cfg
# (no debug assertions) and features; it does not prove that the optimised code compiles (an
# optimiser failure) nor how fast it runs. Figures: docs/deploy.md.
# Without CI the Dockerfile's profile is built as is. cargo-chef is installed unoptimised
# (`cargo install --debug`): it only plans and drives cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dockerfile=$root/Dockerfile

# The single line of the Dockerfile matching $1 (an extended regex), or a loud failure.
only_line() {
  local lines
  lines=$(grep -E "$1" "$dockerfile" || true)
  if [ -z "$lines" ] || [ "$(printf '%s\n' "$lines" | wc -l)" -ne 1 ]; then
    echo "FATAL: expected exactly one line matching /$1/ in the Dockerfile, found:" >&2
    printf '%s\n' "$lines" >&2
    exit 1
  fi
  printf '%s\n' "$lines"
}
chef_version=$(only_line '^ARG CARGO_CHEF_VERSION=' | sed 's/^ARG CARGO_CHEF_VERSION=//')
prepare=$(only_line '^RUN cargo chef prepare ' | sed 's/^RUN //')
cook=$(only_line '^RUN cargo chef cook ' | sed 's/^RUN //')
build=$(grep -A1 -x '# image-build-command:' "$dockerfile" | sed -n '2s/^RUN //p')
[ -n "$build" ] || { echo "FATAL: no 'RUN' line after '# image-build-command:' in the Dockerfile" >&2; exit 1; }
case "$build" in
  *'\'*|*'&&'*|*';'*) echo "FATAL: the image's build command must be one plain cargo command: $build" >&2; exit 1 ;;
esac
echo "image: cargo-chef $chef_version; cook: $cook; build: $build"

# 1. cargo-chef, pinned.
tools=$root/target/image/tools
if [ "$("$tools/bin/cargo-chef" --version 2>/dev/null || true)" != "cargo-chef $chef_version" ]; then
  echo "installing cargo-chef $chef_version into $tools"
  CARGO_TARGET_DIR=$root/target/image/tools-build \
    cargo install cargo-chef --locked --debug --version "$chef_version" --root "$tools"
fi
if [ -n "${CI:-}" ]; then
  export CARGO_PROFILE_RELEASE_OPT_LEVEL="${CARGO_PROFILE_RELEASE_OPT_LEVEL:-0}"
  export CARGO_PROFILE_RELEASE_DEBUG="${CARGO_PROFILE_RELEASE_DEBUG:-0}"
fi
echo "image: release profile opt-level ${CARGO_PROFILE_RELEASE_OPT_LEVEL:-as in Cargo.toml}"
export PATH="$tools/bin:$PATH"
export CARGO_TARGET_DIR=$root/target/image/cargo
export CARGO_TERM_COLOR=never

# The build context as `COPY . .` sees it: tracked and untracked files that neither .gitignore
# nor .dockerignore excludes, with their modification times (as COPY keeps them).
ignore_regex=$(grep -vE '^[[:space:]]*(#|$)' .dockerignore | sed -E 's#/+$##; s#\.#\\.#g' |
  while read -r pattern; do
    case "$pattern" in
      '**/'*) printf '(^|/)%s(/|$)\n' "${pattern#'**/'}" ;;
      *) printf '^%s(/|$)\n' "$pattern" ;;
    esac
  done | paste -sd'|')
copy_context() {
  git ls-files -z --cached --others --exclude-standard |
    grep -zvE "$ignore_regex" |
    while IFS= read -r -d "" f; do if [ -e "$f" ]; then printf "%s\0" "$f"; fi; done |
    tar --null -T - -cf - | tar -xf - -C "$1"
}

planner=$(mktemp -d)
stage=$(mktemp -d)
trap 'rm -rf "$planner" "$stage"' EXIT

# 2. The planner stage.
copy_context "$planner"
(cd "$planner" && $prepare)

# 3. The build stage: the recipe alone, cooked; then the sources and the build command.
cp "$planner/recipe.json" "$stage/"
start=$(date +%s)
(cd "$stage" && $cook)
cooked=$(date +%s)
touch "$stage/.cooked"
copy_context "$stage"
(cd "$stage" && $build)
built=$(date +%s)
echo "image: cook $((cooked - start)) s, build $((built - cooked)) s"

# Every bin, example, bench and test target is in the recipe, so `cook` stubbed all of them.
cargo metadata --format-version 1 --no-deps --manifest-path "$planner/Cargo.toml" >"$planner/metadata.json"
python3 - "$planner/metadata.json" "$planner/recipe.json" <<'EOF'
import json, sys
meta = json.load(open(sys.argv[1]))
recipe = json.load(open(sys.argv[2]))
root = meta["workspace_root"]
declared = set()
for pkg in meta["packages"]:
    for t in pkg["targets"]:
        for kind in t["kind"]:
            if kind in ("bin", "example", "bench", "test"):
                declared.add((kind, t["src_path"][len(root) + 1:]))
in_recipe = set()
for m in recipe["skeleton"]["manifests"]:
    for t in m["targets"]:
        kind = t["kind"] if isinstance(t["kind"], str) else next(iter(t["kind"]))
        in_recipe.add((kind.lower(), t["path"]))
missing = sorted(d for d in declared if d not in in_recipe)
if missing:
    sys.exit(f"FATAL: targets missing from the cargo-chef recipe: {missing}")
kinds = {}
for kind, _ in declared:
    kinds[kind] = kinds.get(kind, 0) + 1
print("image: the recipe lists every target:", ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
EOF

# Every binary the runtime stage copies was built by the build command, after the cook (not one
# of cook's stubs); and every example is built.
copied=$(sed -nE 's#^COPY --from=build /src/target/([^ ]+) .*#\1#p' "$dockerfile")
[ -n "$copied" ] || { echo "FATAL: the Dockerfile copies nothing from the build stage" >&2; exit 1; }
examples=$(python3 -c 'import json,sys
for p in json.load(open(sys.argv[1]))["packages"]:
    for t in p["targets"]:
        if "example" in t["kind"]: print("release/examples/" + t["name"])' "$planner/metadata.json")
for artifact in $copied $examples; do
  path=$CARGO_TARGET_DIR/$artifact
  if [ ! -x "$path" ] || [ ! "$path" -nt "$stage/.cooked" ]; then
    echo "FATAL: $artifact was not built by the image's build command ($build)" >&2
    exit 1
  fi
done
"$CARGO_TARGET_DIR/release/acp-gateway" --version
echo "image: built $(printf "%s\n" $copied $examples | sort -u | wc -l) artifacts the image's way, in $(($(date +%s) - start)) s after the recipe"
