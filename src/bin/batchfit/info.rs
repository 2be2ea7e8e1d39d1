//! The commands that only inform: `doctor`, `models`, `completions`, `man`.

use batchfit::cli;
use batchfit::device::cuda::{self, fake::FakeGpus};
use batchfit::doctor;
use batchfit::exit::{fail, print_stdout, Exit, Fail};
use batchfit::plan::model::{Architecture, ModelSpec, ZOO};
use batchfit::plan::Plan;
use batchfit::workload::runner::Runner;

/// `batchfit doctor [--json] [--plan PLAN]`: exit 3 when no GPU can be queried (the report says why).
pub fn doctor(json: bool, plan: Option<&std::path::Path>) -> Result<Exit, Fail> {
    let plan = plan
        .map(Plan::read)
        .transpose()
        .map_err(fail(Exit::Usage))?;
    let mut report = match cuda::gpus() {
        Ok(n) => doctor::diagnose(n.as_ref(), plan.as_ref()),
        Err(e) => doctor::diagnose(
            &FakeGpus {
                fail: Some(e),
                ..Default::default()
            },
            plan.as_ref(),
        ),
    };
    report.torch_runner = Some(torch_runner());
    if json {
        print_stdout(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report).expect("report serialises")
        ))?;
    } else {
        print_stdout(&report.to_text())?;
    }
    Ok(if report.ok {
        Exit::Success
    } else {
        Exit::Environment
    })
}

/// One line on the torch runner: where it is, the torch it runs on and whether that sees CUDA.
fn torch_runner() -> String {
    let runner = match Runner::locate() {
        Ok(r) => r,
        Err(e) => return format!("not usable: {e}"),
    };
    let cuda = match runner.info() {
        Ok(i) if i.cuda_available => format!("CUDA: {} device(s)", i.cuda_device_count),
        Ok(i) => match i.cuda_library {
            Some(why) => format!("CUDA: not available ({why})"),
            None => "CUDA: no device".into(),
        },
        Err(e) => return format!("{} does not start: {e}", runner.exe.display()),
    };
    format!(
        "{} on torch {} at {} (through {}); {cuda}",
        runner.exe.display(),
        runner.torch.version,
        runner.torch.dir.display(),
        runner.torch.python.display()
    )
}

/// `batchfit models`: every built-in model with its parameter count and default input shape.
pub fn models(json: bool) -> Result<Exit, Fail> {
    let rows: Vec<(&str, u64, String)> = ZOO
        .iter()
        .map(|name| {
            let spec = ModelSpec {
                architecture: Architecture::preset(name).expect("zoo preset"),
                optimizer: Default::default(),
                precision: Default::default(),
            };
            (*name, spec.parameter_count(), spec.input_spec())
        })
        .collect();
    let text = if json {
        #[derive(serde::Serialize)]
        struct Row<'a> {
            name: &'a str,
            parameter_count: u64,
            input_spec: &'a str,
        }
        let v: Vec<Row> = rows
            .iter()
            .map(|(n, p, i)| Row {
                name: n,
                parameter_count: *p,
                input_spec: i,
            })
            .collect();
        format!(
            "{}\n",
            serde_json::to_string_pretty(&v).expect("list serialises")
        )
    } else {
        let mut s = format!("{:<12} {:>13}  {}\n", "MODEL", "PARAMETERS", "INPUT");
        for (n, p, i) in &rows {
            s.push_str(&format!("{n:<12} {p:>13}  {i}\n"));
        }
        s
    };
    print_stdout(&text)?;
    Ok(Exit::Success)
}

/// `batchfit completions SHELL`.
pub fn completions(shell: clap_complete::Shell) -> Result<Exit, Fail> {
    let mut buf = Vec::new();
    cli::completions(shell, &mut buf);
    print_stdout(&String::from_utf8_lossy(&buf))?;
    Ok(Exit::Success)
}

/// `batchfit man [SUBCOMMAND]`.
pub fn man(subcommand: Option<&str>) -> Result<Exit, Fail> {
    let mut buf = Vec::new();
    cli::man_page(subcommand, &mut buf).map_err(|e| match e {
        cli::ManError::NoSubcommand(_) => Fail(Exit::Usage, e.into()),
        cli::ManError::Io(_) => Fail(Exit::Environment, e.into()),
    })?;
    print_stdout(&String::from_utf8_lossy(&buf))?;
    Ok(Exit::Success)
}

/// `batchfit python-helper`: the helper for training scripts probed with `--exec`.
pub fn python_helper() -> Result<Exit, Fail> {
    print_stdout(batchfit::workload::exec::PYTHON_HELPER)?;
    Ok(Exit::Success)
}
