#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){size_t n=atol(v[1])<<20; int it=atoi(v[2]);
 char*a=malloc(n),*b=malloc(n); memset(a,1,n);memset(b,2,n);
 for(int k=0;k<2;k++) memcpy(b,a,n);
 double t=now(); for(int k=0;k<it;k++) memcpy(b,a,n); t=now()-t;
 printf("memcpy %zu MiB: %.2f GB/s (buffer bytes/s)\n", n>>20, (double)n*it/t/1e9);
 float*x=(float*)a,*y=(float*)b; size_t m=n/4;
 t=now(); for(int k=0;k<it;k++) for(size_t i=0;i<m;i++) y[i]+=x[i]; t=now()-t;
 printf("y+=x %zu MiB: %.2f GB/s\n", n>>20, (double)n*it/t/1e9);
 return 0;}
