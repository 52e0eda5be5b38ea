//! The macros that turn the case list into tests: `suite!` (one `#[test]`
//! per case, plus the lock-taker helper test) and the case table behind
//! [`CASES`](crate::CASES). The case list itself is `__for_each_case!` in
//! `cases/mod.rs`.

#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    (() $($group:ident :: $case:ident),* $(,)?) => {
        &[$(
            $crate::Case {
                name: stringify!($case),
                group: stringify!($group),
                run: |cx| ::std::boxed::Box::pin(async move { $crate::cases::$group::$case(&cx).await }),
            }
        ),*]
    };
}

/// Generates one `#[test]` per conformance case, each running against the
/// factory `$factory` (an expression evaluated inside the test's runtime;
/// `.await` allowed). Cases listed in `skip = [..]` are left out, loudly.
/// Cases listed in `expect_skips = [..]` are the ones this backend cannot
/// run (each still prints its `SKIP name: why` line); any other skip fails
/// its test, and so does a listed case that passes.
///
/// ```ignore
/// lock_conformance::suite!(lock_conformance::shared(lockcore::MemoryBackend::new()));
/// lock_conformance::suite!(my_store::factory().await, skip = [every_waiter_is_served]);
/// lock_conformance::suite!(my_store::factory().await, expect_skips = [server_clock_steps_are_judged_on_the_server]);
/// ```
#[macro_export]
macro_rules! suite {
    ($factory:expr
        $(, skip = [$($skip:ident),* $(,)?])?
        $(, expect_skips = [$($expected:ident),* $(,)?])?
        $(,)?) => {
        $crate::__for_each_case! { __suite_tests ($factory; [$($($skip),*)?]; [$($($expected),*)?]) }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    (($factory:expr; [$($skip:ident),*]; [$($expected:ident),*]) $($group:ident :: $case:ident),* $(,)?) => {
        const __LOCK_CONFORMANCE_SKIP: &[&str] = &[$(stringify!($skip)),*];
        const __LOCK_CONFORMANCE_EXPECT_SKIPS: &[&str] = &[$(stringify!($expected)),*];
        $(
            #[test]
            fn $case() {
                $crate::__private::run_test(
                    stringify!($case),
                    __LOCK_CONFORMANCE_SKIP,
                    __LOCK_CONFORMANCE_EXPECT_SKIPS,
                    module_path!(),
                    || async { $factory },
                );
            }
        )*

        /// Not a test: the lock-taker helper process the cross-process cases
        /// start by re-running this binary (see `lock_conformance::taker`).
        #[test]
        #[ignore = "helper process for cross-process cases, run by the suite itself"]
        fn lock_taker_process() {
            $crate::__private::taker_main(|| async { $factory });
        }
    };
}
