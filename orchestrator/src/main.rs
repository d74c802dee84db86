fn main() {
    std::process::exit(hull::cli::main());
}
