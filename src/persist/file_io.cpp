#include "persist/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "kvcore/error.hpp"

namespace kvcore::persist {

namespace {

[[noreturn]] void fail(const char* what, const std::string& path, int err) {
  const ErrorCode code = err == ENOSPC || err == EDQUOT ? ErrorCode::OutOfMemory : ErrorCode::DeviceError;
  throw Error(code, detail::concat(what, " '", path, "': ", std::strerror(err)));
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> pieces, bool durable) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = detail::concat(path, ".tmp.", ::getpid(), ".", counter++);
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f.fd < 0) fail("cannot create", tmp, errno);
  try {
    for (std::span<const uint8_t> p : pieces) {
      size_t done = 0;
      while (done < p.size()) {
        const ssize_t n = ::write(f.fd, p.data() + done, p.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail("cannot write", tmp, errno);
        done += static_cast<size_t>(n);
      }
    }
    if (durable && ::fsync(f.fd) != 0) fail("cannot fsync", tmp, errno);
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) fail("cannot close", tmp, errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename onto", path, errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (!durable) return;
  const std::string dir = dir_of(path);
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0) fail("cannot open directory", dir, errno);
  if (::fsync(d.fd) != 0) fail("cannot fsync directory", dir, errno);
}

std::vector<uint8_t> read_file(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  require_arg(f.fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("cannot stat", path, errno);
  std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(f.fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read", path, errno);
    if (n == 0) break;  // shrank meanwhile: the parser sees a truncated file
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

}  // namespace kvcore::persist
