//! The plan reader: errors that name the field, and hostile inputs that never panic.

use mscclpp_executor::{Plan, testgen};
use proptest::prelude::*;
use serde_json::{Value, json};

fn err(v: &Value, n: usize) -> String {
    match Plan::from_value(v, n) {
        Ok(_) => panic!("the plan was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn generated_plans_validate() {
    for n in 2..=4 {
        for inplace in [false, true] {
            for v in [
                testgen::allreduce_simple(n, inplace),
                testgen::allreduce_ll(n, inplace),
                testgen::allgather_simple(n, inplace),
            ] {
                let p = Plan::from_value(&v, n).unwrap();
                assert_eq!(p.nranks(), n);
            }
        }
    }
}

#[test]
fn an_unknown_op_is_named_with_its_path() {
    let mut v = testgen::allreduce_simple(2, false);
    v["gpus"][1]["threadblocks"][0]["ops"][2]["name"] = json!("frobnicate");
    let e = err(&v, 2);
    assert!(
        e.contains("gpus[1].threadblocks[0].ops[2].name")
            && e.contains("unknown operation \"frobnicate\""),
        "{e}"
    );
}

#[test]
fn a_chunk_past_its_buffer_is_named() {
    let mut v = testgen::allreduce_simple(3, false);
    v["gpus"][2]["threadblocks"][0]["ops"][2]["src_buff"][0]["index"] = json!(3);
    let e = err(&v, 3);
    assert!(
        e.contains("gpus[2].threadblocks[0].ops[2].src_buff[0].index")
            && e.contains("chunks 3..4 lie past the end of buffer i, which has 3"),
        "{e}"
    );
}

#[test]
fn a_missing_channel_is_named() {
    let mut v = testgen::allreduce_simple(2, false);
    v["gpus"][0]["threadblocks"][0]["ops"][0]["channel_ids"] = json!([0, 1]);
    let e = err(&v, 2);
    assert!(
        e.contains("gpus[0].threadblocks[0].ops[0].channel_ids[1]")
            && e.contains("memory channel 1 does not exist: the threadblock has 1"),
        "{e}"
    );
}

#[test]
fn a_plan_for_another_rank_count_is_refused() {
    let v = testgen::allgather_simple(4, false);
    let e = err(&v, 2);
    assert!(
        e.contains("field gpus: the plan is for 4 ranks but the communicator has 2"),
        "{e}"
    );
}

#[test]
fn a_missing_field_is_named() {
    let mut v = testgen::allreduce_ll(2, false);
    v["gpus"][1]
        .as_object_mut()
        .unwrap()
        .remove("scratch_chunks");
    let e = err(&v, 2);
    assert!(
        e.contains("gpus[1].scratch_chunks: missing (a required field)"),
        "{e}"
    );
}

#[test]
fn malformed_and_oversized_bytes_are_errors() {
    assert!(Plan::from_bytes(b"{", 2).is_err());
    assert!(Plan::from_bytes(b"[]", 2).is_err());
    let deep = "[".repeat(100_000);
    assert!(Plan::from_bytes(deep.as_bytes(), 2).is_err());
    let big = vec![b' '; mscclpp_executor::plan::MAX_PLAN_BYTES + 1];
    assert!(Plan::from_bytes(&big, 2).is_err());
}

/// A replacement for a JSON value: small numbers (also out-of-range ones), strings (op names,
/// buffer types, junk), and other kinds.
fn junk() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..8).prop_map(Value::from),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(Value::Null),
        Just(json!(true)),
        Just(json!([])),
        Just(json!({})),
        prop::sample::select(vec![
            "i", "o", "s", "memory", "port", "switch", "put", "ppkt", "x"
        ])
        .prop_map(Value::from),
    ]
}

/// Every path to a value in `v` (object keys and array indexes).
fn paths(v: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(at.clone());
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                at.push(k.clone());
                paths(x, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(i.to_string());
                paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = v;
    for p in path {
        cur = match cur {
            Value::Object(o) => o.get_mut(p)?,
            Value::Array(a) => a.get_mut(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Random mutations of valid plans (values replaced, fields removed) give Ok or Err, never
    /// a panic; a plan that still validates also flattens (or errs) without panicking.
    #[test]
    fn mutated_plans_never_panic(
        which in 0usize..3,
        n in 2usize..5,
        edits in prop::collection::vec((any::<prop::sample::Index>(), junk(), any::<bool>()), 1..4),
    ) {
        let mut v = match which {
            0 => testgen::allreduce_simple(n, false),
            1 => testgen::allreduce_ll(n, true),
            _ => testgen::allgather_simple(n, false),
        };
        for (idx, replacement, remove) in edits {
            let mut all = Vec::new();
            paths(&v, &mut Vec::new(), &mut all);
            let path = idx.get(&all).clone();
            if remove && !path.is_empty() {
                let (last, parent) = path.split_last().unwrap();
                if let Some(Value::Object(o)) = at_mut(&mut v, parent) {
                    o.remove(last);
                }
            } else if let Some(slot) = at_mut(&mut v, &path) {
                *slot = replacement;
            }
        }
        if let Ok(plan) = Plan::from_value(&v, n) {
            for rank in 0..n {
                let _ = mscclpp_executor::flat::flatten(
                    &plan,
                    rank,
                    mscclpp_executor::flat::Sizes { input: 4096 * n as u64, output: 4096 * n as u64 },
                );
            }
        }
        let bytes = serde_json::to_vec(&v).unwrap();
        let _ = Plan::from_bytes(&bytes, n);
    }
}
