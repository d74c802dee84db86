//! Tier 1 on Linux. (in progress)
pub fn exec_main(_plan: String, _argv: Vec<std::ffi::OsString>) -> anyhow::Result<i32> {
    anyhow::bail!("not built yet")
}
