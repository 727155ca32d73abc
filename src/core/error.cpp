#include "kvcore/error.hpp"

namespace kvcore {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument: return "InvalidArgument";
    case ErrorCode::OutOfMemory: return "OutOfMemory";
    case ErrorCode::NotSupported: return "NotSupported";
    case ErrorCode::Corrupt: return "Corrupt";
    case ErrorCode::DeviceError: return "DeviceError";
  }
  return "Error";
}

}  // namespace kvcore
