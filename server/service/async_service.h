// AsyncGpuMemory: the gpumem.v1.GpuMemory service object the daemon
// registers, with every method served asynchronously from its completion
// queues: the unary methods by GpuMemoryService (gpumem_service.h), Stream
// raw (ByteBuffers) by StreamService (stream_service.h). With no method
// served synchronously, no call holds a gRPC thread while it is in flight.
#ifndef GPUMEMD_SERVER_SERVICE_ASYNC_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_ASYNC_SERVICE_H_

#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {

using AsyncGpuMemory = v1::GpuMemory::WithAsyncMethod_Allocate<
    v1::GpuMemory::WithAsyncMethod_Free<
    v1::GpuMemory::WithAsyncMethod_GetStats<
    v1::GpuMemory::WithAsyncMethod_GetSession<
    v1::GpuMemory::WithAsyncMethod_GetUsage<
    v1::GpuMemory::WithAsyncMethod_GetLedger<
    v1::GpuMemory::WithAsyncMethod_SetQuota<
    v1::GpuMemory::WithAsyncMethod_PutTenant<
    v1::GpuMemory::WithAsyncMethod_DeleteTenant<
    v1::GpuMemory::WithAsyncMethod_Resume<
    v1::GpuMemory::WithRawMethod_Stream<v1::GpuMemory::Service>>>>>>>>>>>;

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_ASYNC_SERVICE_H_
