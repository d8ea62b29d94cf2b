//! The README's usage blocks are what `--help` prints: for `tern serve`, `tern run`, `tern gate`
//! and `tern demo` (with `tern demo export`), the block holds the usage lines and every option
//! of the long help, under the same headings and in the same order, without the descriptions
//! (`tern CMD --help` has those). A flag added, renamed or given another value name fails this
//! test until the README says so; the failure prints the block to paste.

use clap::CommandFactory;

const README: &str = include_str!("../../README.md");

/// Lines of options are wrapped at this width (the README's prose width).
const WIDTH: usize = 96;

/// The usage block of `tern PATH...` as the README shows it, made from the long help clap
/// renders for it.
fn usage_block(path: &[&str]) -> String {
    let mut tern = crate::Cli::command();
    // Global arguments (`--log-format`) and bin names reach subcommands when built.
    tern.build();
    let mut command = &mut tern;
    for name in path {
        command = command
            .find_subcommand_mut(name)
            .unwrap_or_else(|| panic!("no subcommand {name}"));
    }
    summarise(&command.render_long_help().to_string())
}

/// The usage lines, then each heading of options with the options' names and value names
/// (`--listen <ADDR:PORT>`), two spaces apart and wrapped. Positional arguments are in the
/// usage lines; subcommands get blocks of their own; `--help` is left out.
fn summarise(help: &str) -> String {
    let mut out = String::new();
    let mut lines = help.lines().peekable();
    // Skip the about text: the usage lines start the block.
    for line in lines.by_ref() {
        if line.starts_with("Usage: ") {
            out.push_str(line);
            out.push('\n');
            break;
        }
    }
    while let Some(line) = lines.next_if(|l| l.starts_with("       ")) {
        out.push_str(line);
        out.push('\n');
    }
    let mut heading: Option<&str> = None;
    let mut options: Vec<&str> = Vec::new();
    let flush = |heading: Option<&str>, options: &mut Vec<&str>, out: &mut String| {
        if let Some(heading) = heading.filter(|_| !options.is_empty()) {
            out.push_str(heading);
            out.push('\n');
            wrap(options, out);
        }
        options.clear();
    };
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        if indent == 0 && line.ends_with(':') {
            flush(heading, &mut options, &mut out);
            heading = match line {
                "Arguments:" | "Commands:" => None,
                _ => Some(line),
            };
        } else if heading.is_some() && indent < 10 && line.trim_start().starts_with('-') {
            // An option's own line ("      --listen <ADDR:PORT>", or "--data <DIR>  help" when
            // clap puts the help beside it); deeper lines are descriptions and values.
            let option = line.trim_start().split("  ").next().unwrap_or_default();
            if !option.ends_with("--help") {
                options.push(option);
            }
        }
    }
    flush(heading, &mut options, &mut out);
    out
}

/// `options` as lines of at most `WIDTH` characters, each indented by two spaces.
fn wrap(options: &[&str], out: &mut String) {
    let mut line = String::new();
    for option in options {
        if !line.is_empty() && line.len() + 2 + option.len() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        // Two spaces: the indent of a new line, or the gap after the previous option.
        line.push_str("  ");
        line.push_str(option);
    }
    if !line.is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
}

/// The README's fenced `text` blocks.
fn readme_text_blocks() -> impl Iterator<Item = &'static str> {
    README.split("```text\n").skip(1).filter_map(|rest| {
        let end = rest.find("```")?;
        Some(&rest[..end])
    })
}

/// The README block that starts with the same usage line as `expected` must be `expected`.
fn check(command: &str, expected: &str) {
    let first = expected.lines().next().unwrap();
    let found = readme_text_blocks().find(|b| b.lines().next() == Some(first));
    match found {
        Some(block) if block == expected => {}
        Some(block) => panic!(
            "README.md's usage block for `{command}` is not what `{command} --help` prints.\n\
             README has:\n{block}\nReplace it with:\n{expected}"
        ),
        None => panic!(
            "README.md has no ```text block starting with {first:?} (`{command} --help`). \
             Add:\n{expected}"
        ),
    }
}

#[test]
fn tern_serve_usage_matches_help() {
    check("tern serve", &usage_block(&["serve"]));
}

#[test]
fn tern_run_usage_matches_help() {
    check("tern run", &usage_block(&["run"]));
}

#[test]
fn tern_gate_usage_matches_help() {
    check("tern gate", &usage_block(&["gate"]));
}

#[test]
fn tern_demo_usage_matches_help() {
    // One block for the command and its `export`: the README shows them together.
    let block = usage_block(&["demo"]) + "\n" + &usage_block(&["demo", "export"]);
    check("tern demo", &block);
}

#[test]
fn summary_keeps_usage_headings_and_options_only() {
    let help = "About.\n\nUsage: tern x [OPTIONS] <DIR>\n       tern x --check\n\n\
                Arguments:\n  <DIR>  The folder\n\nOptions:\n      --listen <ADDR:PORT>\n          \
                Where [default: 127.0.0.1:8080]\n          - on\n      --pin\n  -h, --help\n          \
                Print help\n\nBans:\n      --ban <on|off>  Ban them\n";
    assert_eq!(
        summarise(help),
        "Usage: tern x [OPTIONS] <DIR>\n       tern x --check\nOptions:\n  \
         --listen <ADDR:PORT>  --pin\nBans:\n  --ban <on|off>\n"
    );
}
