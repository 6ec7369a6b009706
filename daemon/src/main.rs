fn main() -> std::process::ExitCode {
    rigd::cli::main()
}
