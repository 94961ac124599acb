//! `DLTSUB_CHAOS` plans: `parse_plan` never panics, and a plan it accepts prints (as the
//! chaos report lines do) to rules that parse back to the same plan.
#![no_main]

use dltsub_chaos_points::parse_plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(rules) = parse_plan(text) else {
        return;
    };
    assert!(rules.iter().all(|rule| rule.hit >= 1));
    let printed: Vec<String> = rules.iter().map(ToString::to_string).collect();
    let printed = printed.join(",");
    assert_eq!(
        parse_plan(&printed).as_ref(),
        Ok(&rules),
        "{text:?} printed as {printed:?}"
    );
});
