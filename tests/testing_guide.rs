//! docs/testing-your-code.md quotes its three example tests whole: they must
//! be the files CI runs, not copies that drifted.

#[test]
fn the_guide_quotes_each_example_test_as_it_is() {
    let guide = include_str!("../docs/testing-your-code.md");
    let examples = [
        ("tests/testing_worker.rs", include_str!("testing_worker.rs")),
        ("tests/testing_leader.rs", include_str!("testing_leader.rs")),
        ("tests/testing_job.rs", include_str!("testing_job.rs")),
    ];
    for (file, text) in examples {
        assert!(
            guide.contains(&format!("```rust\n{text}```")),
            "docs/testing-your-code.md does not quote {file} as it is: paste it again"
        );
    }
}
