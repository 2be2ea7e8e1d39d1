/* A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for tests of batchfit's real NVML adapter
 * (src/gpu/nvml.rs, through nvml-wrapper) on machines without a GPU. It implements the handful of
 * entry points batchfit calls, with the signatures and structures of nvml.h, and answers from a
 * text file named by NVML_STUB_CONFIG, read at nvmlInit_v2:
 *
 *   driver 580.95.05
 *   init_error 9                                  (nvmlInit_v2 returns this code; 9: driver not loaded)
 *   gpu NAME|UUID|TOTAL|FREE|USED|RESERVED        (one line per GPU, bytes)
 *   proc GPU PID BYTES                            (BYTES -1: NVML_VALUE_NOT_AVAILABLE)
 *   procs_unsupported GPU                         (the process query returns NOT_SUPPORTED)
 *
 * Built by tests/nvml_stub.rs with the system C compiler. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_UNKNOWN 999

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    char name[96], uuid[96];
    unsigned long long total, free, used, reserved;
    int procs_unsupported;
    unsigned int nprocs;
    nvmlProcessInfo_t procs[16];
} gpu_t;

static gpu_t gpus[8];
static unsigned int ngpus;
static char driver[80] = "580.95.05";
static int initialised;

static int load(void) {
    const char *path = getenv("NVML_STUB_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[512];
    int init_error = NVML_SUCCESS;
    ngpus = 0;
    if (!f) return NVML_ERROR_UNKNOWN;
    while (fgets(line, sizeof line, f)) {
        unsigned int g, pid;
        long long bytes;
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (sscanf(line, "driver %79s", driver) == 1) continue;
        if (sscanf(line, "init_error %d", &init_error) == 1) continue;
        if (sscanf(line, "procs_unsupported %u", &g) == 1 && g < 8) {
            gpus[g].procs_unsupported = 1;
            continue;
        }
        if (sscanf(line, "proc %u %u %lld", &g, &pid, &bytes) == 3 && g < 8 && gpus[g].nprocs < 16) {
            nvmlProcessInfo_t *p = &gpus[g].procs[gpus[g].nprocs++];
            p->pid = pid;
            p->usedGpuMemory = bytes < 0 ? ~0ULL : (unsigned long long)bytes;
            p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFFu;
            continue;
        }
        if (strncmp(line, "gpu ", 4) == 0 && ngpus < 8) {
            gpu_t *d = &gpus[ngpus];
            char *name = line + 4, *uuid = strchr(name, '|'), *rest;
            if (!uuid) continue;
            *uuid++ = 0;
            rest = strchr(uuid, '|');
            if (!rest) continue;
            *rest++ = 0;
            snprintf(d->name, sizeof d->name, "%.95s", name);
            snprintf(d->uuid, sizeof d->uuid, "%.95s", uuid);
            if (sscanf(rest, "%llu|%llu|%llu|%llu", &d->total, &d->free, &d->used, &d->reserved) == 4) ngpus++;
        }
    }
    fclose(f);
    return init_error;
}

static gpu_t *dev(void *handle) {
    uintptr_t i = (uintptr_t)handle;
    return (i >= 1 && i <= ngpus) ? &gpus[i - 1] : NULL;
}

static int copy(char *dst, unsigned int len, const char *src) {
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

int nvmlInit_v2(void) {
    int r = load();
    initialised = r == NVML_SUCCESS;
    return r;
}

int nvmlShutdown(void) {
    initialised = 0;
    return NVML_SUCCESS;
}

int nvmlSystemGetDriverVersion(char *version, unsigned int len) {
    return initialised ? copy(version, len, driver) : NVML_ERROR_UNINITIALIZED;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *count = ngpus;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (void *)(uintptr_t)(index + 1);
    return NVML_SUCCESS;
}

int nvmlDeviceGetName(void *device, char *name, unsigned int len) {
    gpu_t *d = dev(device);
    return d ? copy(name, len, d->name) : NVML_ERROR_INVALID_ARGUMENT;
}

int nvmlDeviceGetUUID(void *device, char *uuid, unsigned int len) {
    gpu_t *d = dev(device);
    return d ? copy(uuid, len, d->uuid) : NVML_ERROR_INVALID_ARGUMENT;
}

int nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *m) {
    gpu_t *d = dev(device);
    /* nvml.h: NVML_STRUCT_VERSION(Memory, 2) = sizeof | 2 << 24 */
    if (!d || m->version != ((unsigned int)sizeof(nvmlMemory_v2_t) | (2u << 24))) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = d->total;
    m->free = d->free;
    m->used = d->used;
    m->reserved = d->reserved;
    return NVML_SUCCESS;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, nvmlProcessInfo_t *infos) {
    gpu_t *d = dev(device);
    if (!d) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->procs_unsupported) return NVML_ERROR_NOT_SUPPORTED;
    if (*count < d->nprocs || !infos) {
        int empty = d->nprocs == 0;
        *count = d->nprocs;
        return empty ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(infos, d->procs, d->nprocs * sizeof(nvmlProcessInfo_t));
    *count = d->nprocs;
    return NVML_SUCCESS;
}
