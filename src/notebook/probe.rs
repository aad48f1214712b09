//! What the notebook's variables hold, by a framework's own types, with no call of the
//! notebook's: the probe gpumem-kernel compiles into the session library for burn 0.21
//! (`kernel/src/build/variable_probe.rs`), which evcxr shows each variable a cell ends with
//! before storing it. Read here with every full reading: the answer of the last cell that stored
//! variables, found through `device::cuda::books`. Without a probe (the stock kernel, no burn, a
//! burn it does not know) there is no answer, and nothing is loaded to look for one.
#![forbid(unsafe_code)]

use super::protocol::VariablesReading;

/// Where the numbers come from.
#[cfg(any(feature = "cuda", test))]
pub(crate) const SOURCE: &str = "burn 0.21's own types, read by gpumem-kernel's probe in the session library as \
     each variable is stored at the cell's end: logical bytes (elements × dtype size)";

/// The probe's last answer, when the session library has a probe that has seen a cell.
pub(crate) fn reading() -> Option<VariablesReading> {
    #[cfg(feature = "cuda")]
    {
        let (probe, text) = crate::device::cuda::books::probe_answer(crate::record::cells::SESSION_DEPS_PREFIX)?;
        (probe > 0).then(|| parse(probe, &text))
    }
    #[cfg(not(feature = "cuda"))]
    None
}

/// The probe's lines (`name \t component \t bytes \t tensors \t lazy \t type`); a line that is
/// not one is skipped.
#[cfg(any(feature = "cuda", test))]
fn parse(probe: u64, text: &str) -> VariablesReading {
    let variables = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(6, '\t').collect();
            let [name, component, bytes, tensors, lazy, type_name] = f[..] else { return None };
            Some(super::protocol::VariableHeld {
                name: name.to_string(),
                component: component.to_string(),
                bytes: bytes.parse().ok()?,
                tensors: tensors.parse().ok()?,
                lazy: lazy.parse().ok()?,
                type_name: type_name.to_string(),
            })
        })
        .collect();
    VariablesReading { framework: "burn".into(), probe, source: SOURCE.into(), variables }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_s_lines_are_read_and_a_broken_one_skipped() {
        let text = "model\tparameter\t1628200\t6\t0\tModel<Autodiff<NdArray>>\n\
                    optim\toptimizer_state\t3256400\t12\t0\tOptimizerAdaptor<Adam, Model<…>, …>\n\
                    lazy\tparameter\t0\t0\t4\tModel<B>\n\
                    broken\tparameter\tmany\t1\t0\tX\n\
                    short\ttensor\t4\n";
        let r = parse(7, text);
        assert_eq!(r.probe, 7);
        assert_eq!(r.framework, "burn");
        let names: Vec<&str> = r.variables.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["model", "optim", "lazy"]);
        assert_eq!(r.variables[0].bytes, 1_628_200);
        assert_eq!(r.variables[1].component, "optimizer_state");
        assert_eq!((r.variables[2].tensors, r.variables[2].lazy), (0, 4));
        assert_eq!(r.variables[1].type_name, "OptimizerAdaptor<Adam, Model<…>, …>");
    }

    #[test]
    fn a_process_without_a_probe_has_no_reading() {
        assert_eq!(reading(), None);
    }
}
